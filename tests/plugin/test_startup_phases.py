"""benchmarks/vllm_e2e/startup.py on a made-up server folder: each phase's seconds after launch from the log's clock,
the plugin's warm-ups with their own durations, and the adapters' arrival where they came through the runtime API."""

from __future__ import annotations

import gzip
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks" / "vllm_e2e"))
import startup  # noqa: E402

LOG = """\
(APIServer pid=1) INFO 12-06 01:00:13 [api_utils.py:345] version 0.26.0
(EngineCore pid=2) INFO 12-06 01:00:26 [core.py:100] Initializing a V1 LLM engine
(EngineCore pid=2) INFO 12-06 01:00:28 [gpu_model_runner.py:5250] Starting to load model /tmp/m
(EngineCore pid=2) INFO 12-06 01:00:29 [gpu_model_runner.py:5347] Model loading took 39.15 GiB memory and 0.4 seconds
(EngineCore pid=2) INFO 12-06 01:00:32 [monitor.py:53] torch.compile took 2.92 s in total
(EngineCore pid=2) INFO 12-06 01:00:40 [model_warmup.py:79] moelora: model warm-up ran 56 token counts in 6.5 s
(EngineCore pid=2) INFO 12-06 01:00:46 [gpu_model_runner.py:6844] Graph capturing finished in 6 secs, took 0.50 GiB
(APIServer pid=1) INFO:     Application startup complete.
(APIServer pid=1) INFO 12-06 01:00:48 [launcher.py:1] Application startup complete.
"""


def server(tmp_path: pathlib.Path, *, adapters: str | None) -> pathlib.Path:
    d = tmp_path / "gpt-oss-plugin.2"
    d.mkdir()
    with gzip.open(d / "server.log.gz", "wt") as f:
        f.write(LOG)
    (d / "launched_at.txt").write_text("01:00:00\n")
    (d / "ready_s.txt").write_text("49\n")
    if adapters is not None:
        (d / "adapters_s.txt").write_text(adapters)
    return d


def test_phases_are_seconds_after_launch_with_reported_durations(tmp_path, capsys):
    startup.main([str(server(tmp_path, adapters=None))])
    out = capsys.readouterr().out
    assert "gpt-oss-plugin.2: ready after 49 s; no Triton compiles logged" in out
    assert "| torch.compile done | 32 | 3 | 2.92 |" in out
    assert "| model warm-up done | 40 | 8 | 6.5 |" in out
    assert "| graph capture done | 46 | 6 | 6 |" in out
    assert "| API server ready | 48 | 2 |  |" in out
    assert "adapter" not in out.split("\n")[1]


def test_runtime_adapters_arrival_is_shown_beside_ready(tmp_path, capsys):
    startup.main([str(server(tmp_path, adapters="55\n"))])
    assert "ready after 49 s; last adapter in after 55 s; no Triton compiles" in capsys.readouterr().out
