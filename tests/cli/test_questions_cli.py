"""`daedalus question ...`, `daedalus decide` on a question, `daedalus rulings`, and a ticket refused at filing by
the ruling, as a decider uses them: real CLI processes, a real worker process, the dev server and the store."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from tests.cli.test_ticket_cli import daedalus

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "questions"


def test_a_decider_asks_answers_and_rules_from_the_cli(
    cli_env: dict[str, str], workers: str, tmp_path: Path, task_queue: str
) -> None:
    data = yaml.safe_load((EXAMPLES / "forbid-fp8.yaml").read_text())
    question_id = f"{data['id']}-{task_queue[-8:]}"
    asked = tmp_path / "q.yaml"
    asked.write_text(yaml.safe_dump({**data, "id": question_id, "deciders": ["wayne"]}))
    done = daedalus(cli_env, "question", "ask", "-f", str(asked), "--as", "lead")
    assert done.returncode == 0, done.stderr
    assert f"answer it with `daedalus decide {question_id}-question-1 <rule|decline>`" in " ".join(
        done.stdout.split()
    )
    again = daedalus(cli_env, "question", "ask", "-f", str(asked), "--as", "lead")
    assert (again.returncode == 2 and "already" in again.stderr) or "asked before" in again.stderr

    deadline = time.monotonic() + 60
    while (
        f"{question_id}-question-1"
        not in (shown := daedalus(cli_env, "question", "list", "--pending")).stdout
    ):
        assert time.monotonic() < deadline, shown.stdout + shown.stderr
        time.sleep(0.5)
    show = daedalus(cli_env, "question", "show", question_id)
    assert "status: open" in show.stdout and "options: rule, decline" in show.stdout, (
        show.stdout + show.stderr
    )

    refused = daedalus(cli_env, "decide", f"{question_id}-question-1", "rule", "--as", "lead")
    assert refused.returncode == 2 and "lead may not decide question" in " ".join(refused.stderr.split())
    decided = daedalus(
        cli_env, "decide", f"{question_id}-question-1", "rule", "--as", "wayne", "--note", "struck"
    )
    assert decided.returncode == 0, decided.stderr

    while "status: ruled" not in (show := daedalus(cli_env, "question", "show", question_id)).stdout:
        assert time.monotonic() < deadline, show.stdout + show.stderr
        time.sleep(0.5)
    assert "outcome: rule by wayne: struck" in show.stdout
    rulings = " ".join(daedalus(cli_env, "rulings").stdout.split())
    assert f"ruling {question_id} (" in rulings and "wayne" in rulings
    assert "a vllm preset's kv_cache_dtype must not be [fp8, fp8_e4m3, fp8_e5m2]" in rulings

    # a ticket measuring an fp8 KV preset is refused at filing, naming the ruling
    preset = tmp_path / "vllm-fp8.yaml"
    preset.write_text(
        yaml.safe_dump({"engine": "vllm", "name": "vllm-fp8", "max_model_len": 4096, "kv_cache_dtype": "fp8"})
    )
    ticket = tmp_path / "t.yaml"
    ticket.write_text(yaml.safe_dump({
        "id": f"fp8-{task_queue[-8:]}", "title": "fp8 again", "kind": "measurement", "host": workers,
        "gates": [{"name": "decode", "metric": "decode_tps", "threshold": 1,
                   "command": f"daedalus engine measure decode_tps --preset {preset} --model m"}],
    }))  # fmt: skip
    filed = daedalus(cli_env, "ticket", "create", "-f", str(ticket), "--as", "lead")
    message = " ".join(filed.stderr.split())
    assert filed.returncode == 2, filed.stdout
    assert "contradicts standing rulings" in message and f"ruling {question_id} (" in message
    assert "preset vllm-fp8 has kv_cache_dtype 'fp8'" in message
