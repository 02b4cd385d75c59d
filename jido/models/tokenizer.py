"""The runtime tokenizer: a checkpoint folder's tokenizer.json on the `tokenizers` library."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend

from jido.models.loader import generation_eos_ids, load_config
from jido.utils.shared_values import Shared, SharedValues, file_identity

# Parsed tokenizer.json files, by file: jido never changes a backend after loading (no truncation, padding or added
# tokens), so engines of one model in one process can share one.
_BACKENDS: SharedValues[Backend] = SharedValues()


class Tokenizer:
    """Text <-> token ids for one model, with the ids the engine needs (BOS, EOS, pad, special)."""

    def __init__(
        self,
        backend: Shared[Backend],
        bos_token_id: int | None,
        eos_token_ids: list[int],
        pad_token_id: int | None,
        chat_template: str | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        """``backend``: the parsed tokenizer.json, shared with the process's other tokenizers of that file and held
        while this one lives; ``settings``: the checkpoint's tokenizer_config.json, as read (what ``info`` reports)."""
        self._shared = backend
        self._backend = backend.value
        self._settings = dict(settings or {})
        self._bos_token_id = bos_token_id
        self._eos_token_ids = list(eos_token_ids)
        self._pad_token_id = pad_token_id
        self._chat_template = chat_template
        self._all_special_ids = {i for i, t in self._backend.get_added_tokens_decoder().items() if t.special}

    @classmethod
    def from_folder(cls, folder: Path) -> Tokenizer:
        """Load tokenizer.json plus tokenizer_config.json, config.json and generation_config.json.

        Raises FileNotFoundError when the folder has no tokenizer.json.
        """
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{folder}: no tokenizer.json (jido reads tokenizers' JSON format only)")
        shared = _BACKENDS.get(file_identity(path), lambda: Backend.from_file(str(path)))
        backend = shared.value
        settings = _read_json(folder / "tokenizer_config.json")
        config = load_config(folder)

        def token_id(config_key: str, name: str) -> int | None:
            if config.get(config_key) is not None:
                return config[config_key]
            token = _token_str(settings.get(name))
            return backend.token_to_id(token) if token is not None else None

        eos_ids = generation_eos_ids(folder) or [i for i in [token_id("eos_token_id", "eos_token")] if i is not None]
        return cls(
            shared,
            bos_token_id=token_id("bos_token_id", "bos_token"),
            eos_token_ids=eos_ids,
            pad_token_id=token_id("pad_token_id", "pad_token"),
            chat_template=_chat_template(folder, settings),
            settings=settings,
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids for `text`; with add_special_tokens, BOS (and EOS) as the model's tokenizer adds them.

        Raises ValueError for text that is not valid Unicode (see ``check_encodable``).
        """
        check_encodable(text)
        # encode_batch releases the GIL while it works (encode holds it: a 1 MB text stalls every other
        # thread for over half a second); a batch of one gives the same ids.
        return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self._backend.id_to_token(i) for i in ids]

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows, added ones included (a model's embedding may have more rows)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends generation, e.g. Gemma's <eos> and <end_of_turn>."""
        return list(self._eos_token_ids)

    @property
    def pad_token_id(self) -> int | None:
        return self._pad_token_id

    @property
    def all_special_ids(self) -> set[int]:
        """Ids of the special added tokens: the ones decode(skip_special_tokens=True) drops."""
        return set(self._all_special_ids)

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def info(self) -> dict[str, Any]:
        """tokenizer_config.json as transformers' tokenizer holds it (vLLM's /tokenizer_info): special tokens as
        their text, file paths left out, a ``tokenizer_class`` (transformers' for a bare tokenizer.json where the
        file names none), and the BOS, EOS and pad tokens filled in from their ids where the file leaves them out."""
        info = {key: _added_token_text(value) for key, value in self._settings.items()
                if key not in ("vocab_file", "merges_file", "tokenizer_file")}
        info["tokenizer_class"] = info.get("tokenizer_class") or "PreTrainedTokenizerFast"
        ids = {"bos_token": self.bos_token_id, "eos_token": (self.eos_token_ids or [None])[0],
               "pad_token": self.pad_token_id}
        for key, token_id in ids.items():
            if info.get(key) is None and token_id is not None:
                info[key] = self._backend.id_to_token(token_id)
        return info


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _token_str(token: str | dict | None) -> str | None:
    # HF tokenizer_config.json writes a special token either as a string or as a serialized AddedToken.
    return token.get("content") if isinstance(token, dict) else token


def _added_token_text(value: Any) -> Any:
    """``value`` with each serialized AddedToken (a dict with its ``content``) replaced by its text."""
    if isinstance(value, dict):
        if isinstance(value.get("content"), str):
            return value["content"]
        return {key: _added_token_text(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_added_token_text(v) for v in value]
    return value


def _chat_template(folder: Path, settings: dict[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = settings.get("chat_template")
    if isinstance(template, list):
        # Several named templates: the engine renders the default one.
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


def check_encodable(text: str, name: str = "text") -> None:
    """Raise ValueError, naming ``name``, if ``text`` holds a lone surrogate: it has no UTF-8 bytes, so no tokens."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} is not valid Unicode: character {exc.start} is a lone surrogate "
                         f"({text[exc.start]!r}); text must be encodable as UTF-8") from None
