"""Worker processes start with fork where that is safe, so a script without a main guard runs; where spawn is
used, such a script fails with an error that names the guard."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jido import LLM, SamplingParams
from jido.executor import start_method
from jido.executor.start_method import START_METHOD_ENV, StartMethod, worker_start_method

PROMPTS = [[2, 5, 9, 17, 33, 64], [2, 40, 41], [2, 7, 7, 7, 7, 7, 7, 100, 101, 4], [2, 90]]
MAX_TOKENS = 8
# Engine at the top level, no `if __name__ == "__main__":`. With "thread", the process that runs the script as
# main has a second thread when the engine starts (so spawn is picked); a spawned worker re-running it has not.
UNGUARDED_SCRIPT = """\
import json, logging, sys, threading
from jido import LLM, SamplingParams

logging.basicConfig(level=logging.INFO)
if __name__ == "__main__" and sys.argv[2] == "thread":
    threading.Thread(target=threading.Event().wait, daemon=True).start()
llm = LLM(sys.argv[1], dtype="float32", kv_cache_memory="4MiB", tensor_parallel_size=2)
outputs = llm.generate({prompts}, SamplingParams(temperature=0, max_tokens={max_tokens}), use_tqdm=False)
print(json.dumps([o.outputs[0].token_ids for o in outputs]))
"""


def environment(method: str | None = None) -> dict[str, str]:
    """This process's environment with ``method`` as the override, or without one."""
    env = {k: v for k, v in os.environ.items() if k != START_METHOD_ENV}
    return env if method is None else {**env, START_METHOD_ENV: method}


def run_unguarded_script(tmp_path: Path, model_folder: Path, method: str | None,
                         mode: str = "plain") -> subprocess.CompletedProcess:
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT.format(prompts=PROMPTS, max_tokens=MAX_TOKENS))
    return subprocess.run([sys.executable, str(script), str(model_folder), mode], env=environment(method),
                          capture_output=True, text=True, timeout=180)


def run_in_fresh_process(code: str) -> list:
    """The JSON a fresh interpreter prints after running ``code``, without the override set."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment(), capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_an_unguarded_script_forks_its_workers_and_gives_the_in_process_tokens(tmp_path, tiny_model_folder):
    llm = LLM(str(tiny_model_folder), dtype="float32", kv_cache_memory="4MiB")
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    expected = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    done = run_unguarded_script(tmp_path, tiny_model_folder, method=None)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == expected
    assert "starting 2 worker process(es) with fork: this process has one thread and has not loaded the CUDA driver" \
           in done.stderr


@pytest.mark.parametrize("method, mode", [("spawn", "plain"), (None, "thread")], ids=["override", "threaded"])
def test_an_unguarded_script_under_spawn_fails_naming_the_main_guard(tmp_path, tiny_model_folder, method, mode):
    done = run_unguarded_script(tmp_path, tiny_model_folder, method, mode)
    assert done.returncode != 0
    assert "with spawn" in done.stderr
    assert 'must do it under `if __name__ == "__main__":`, or set JIDO_WORKER_MULTIPROC_METHOD=fork' in done.stderr
    assert done.stdout == ""  # no worker ran the script to its end


def test_a_fresh_process_forks_and_one_with_another_thread_or_an_openmp_pool_spawns():
    decisions = run_in_fresh_process("""
        import json, threading, torch
        from jido.executor.start_method import worker_start_method

        decisions = [worker_start_method()]  # numpy's OpenBLAS pool runs, and stops itself at fork
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        decisions.append(worker_start_method())
        stop.set()
        thread.join()
        decisions.append(worker_start_method())
        torch.set_num_threads(2)  # a pool even on one core (this call starts a thread of torch's too)
        torch.randn(512, 512) @ torch.randn(512, 512)  # starts the OpenMP pool
        decisions.append(worker_start_method())
        print(json.dumps(decisions))
    """)
    lost = ("1 other thread(s) of this process (an OpenMP pool, a Python thread) would be lost in a forked child, "
            "and a lock one held would stay locked")
    fork = ["fork", "this process has one thread and has not loaded the CUDA driver"]
    assert decisions[:3] == [fork, ["spawn", lost], fork]
    assert decisions[3][0] == "spawn" and decisions[3][1].endswith(lost[1:])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_environment_variable_chooses_the_start_method(monkeypatch, method):
    monkeypatch.setenv(START_METHOD_ENV, method)
    assert worker_start_method() == StartMethod(method, f"JIDO_WORKER_MULTIPROC_METHOD={method}")


def test_an_unknown_start_method_in_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv(START_METHOD_ENV, "forkserver")
    with pytest.raises(ValueError, match=r"JIDO_WORKER_MULTIPROC_METHOD='forkserver': it must be fork or spawn"):
        worker_start_method()


def test_a_process_still_importing_its_main_module_for_spawn_does_not_fork(monkeypatch):
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    monkeypatch.setattr(mp.current_process(), "_inheriting", True, raising=False)
    expected = StartMethod("spawn", "this process is a spawned one still importing its main module")
    assert worker_start_method() == expected



def test_a_process_that_loaded_the_cuda_driver_spawns(monkeypatch, tmp_path):
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    maps = tmp_path / "maps"
    maps.write_text("7f3e2c000000-7f3e2c200000 r-xp 00000000 08:01 1234 /usr/lib/libcuda.so.535.104\n")
    monkeypatch.setattr(start_method, "_MAPS", maps)
    assert worker_start_method() == StartMethod(
        "spawn", "this process has loaded the CUDA driver (torch.cuda.is_available() does), and a forked child "
                 "could not initialize it")


KILLED_ENGINE_SCRIPT = """\
import os, sys, time
from multiprocessing import active_children
from jido import LLM

llm = LLM(sys.argv[1], dtype="float32", kv_cache_memory="4MiB", tensor_parallel_size=2)
print(" ".join(str(p.pid) for p in active_children() if p.name.startswith("jido-worker")), flush=True)
time.sleep(600)  # killed by the test
"""


def test_forked_workers_exit_when_their_engine_is_killed(tmp_path, tiny_model_folder):
    script = tmp_path / "killed.py"
    script.write_text(KILLED_ENGINE_SCRIPT)
    engine = subprocess.Popen([sys.executable, str(script), str(tiny_model_folder)], env=environment("fork"),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        workers = [int(pid) for pid in engine.stdout.readline().split()]
        assert len(workers) == 2
    finally:
        engine.kill()
        engine.wait()
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in workers):
        assert time.monotonic() < deadline, f"workers {workers} outlived their killed engine"
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"  # gone between the two reads
