"""response_format and vLLM's structured_outputs over HTTP: outputs follow them; bad ones are 400s naming the field."""
from __future__ import annotations

import json

import jsonschema
import pytest
from server_harness import running_server

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


def test_chat_json_schema_and_completion_choice_follow_their_constraints_streamed_and_not(server):
    client = server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    reply = client.chat.completions.create(model="gemma-3-270m", messages=[{"role": "user", "content": "A person:"}],
                                           response_format=fmt, max_tokens=60, temperature=0)
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
    stream = client.chat.completions.create(model="gemma-3-270m", messages=[{"role": "user", "content": "Someone:"}],
                                            response_format=fmt, max_tokens=60, temperature=0.7, seed=5, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)
    choice = client.completions.create(model="gemma-3-270m", prompt="Is the sky blue? Answer:", max_tokens=5,
                                       extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert choice.choices[0].text in ("yes", "no")
    obj = client.completions.create(model="gemma-3-270m", prompt="JSON:", max_tokens=40, temperature=0,
                                    extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(obj.choices[0].text), dict)


@pytest.mark.parametrize("body, param, says", [
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs", "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one of"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}}},
     "response_format", "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format", "response_format.type"),
])
def test_a_bad_constraint_is_a_400_naming_the_field(server, body, param, says):
    status, _, data = server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 4, **body})
    error = json.loads(data)["error"]
    assert status == 400 and says in error["message"] and error["param"] == param
