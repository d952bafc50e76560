"""Secrets planted in the controller's environment and in an inventory reach no file of the run, no Prefect
parameter and no log: the case gets the inventory's variables, and none of the controller's credentials."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect_api import flow_run_tree, run_evaluate

from flagperf.results.schema import read_result

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]


def test_planted_secrets_are_used_but_never_written_down(flagperf_env: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {name: f"planted-{name.lower()}-{uuid.uuid4().hex}" for name in
               ("LITERAL", "REFERENCED", "PGPASSWORD", "MY_SERVICE_TOKEN", "BUILD_ARG")}
    monkeypatch.setenv("PGPASSWORD", secrets["PGPASSWORD"])
    monkeypatch.setenv("MY_SERVICE_TOKEN", secrets["MY_SERVICE_TOKEN"])
    monkeypatch.setenv("SERVICE_SECRET_REF", secrets["REFERENCED"])
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": [{
        "name": "localhost", "transport": "local",
        "env": {"LITERAL_TOKEN": secrets["LITERAL"], "REF_TOKEN": "${SERVICE_SECRET_REF}"},
        "docker": {"build_args": {"TOKEN": secrets["BUILD_ARG"]}, "extra_options": f"-e X={secrets['LITERAL']}"},
    }]}))
    digest = hashlib.sha256(secrets["LITERAL"].encode()).hexdigest()
    state, run_dir = run_evaluate(
        flagperf_env, cases=["env-check", "digits-infer"], inventory=str(inventory),
        overrides=[f"env-check.expect_sha256={digest}", "env-check.expect_name=LITERAL_TOKEN",
                   "env-check.absent=PGPASSWORD,MY_SERVICE_TOKEN,SERVICE_SECRET_REF"])
    assert state.is_completed(), state.message

    result = read_result(run_dir / "env-check" / "round1" / "localhost_noderank0" / "result.json")
    verdicts = {m.name: m.value for m in result.metrics}
    assert verdicts == {"inventory_env_arrived": 1.0, "controller_secrets_leaked": 0.0}
    assert (run_dir / "digits-infer" / "round1" / "localhost_noderank0" / "job.json").is_file()

    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) > 10
    for path in files:
        data = path.read_bytes()
        for name, secret in secrets.items():
            assert secret.encode() not in data, f"{name} found in {path}"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["hosts"][0]["env"] == {"LITERAL_TOKEN": "<masked>", "REF_TOKEN": "${SERVICE_SECRET_REF}"}

    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        tree = flow_run_tree(flow_run_id)
        stored = [json.dumps(client.read_flow_run(run_id).parameters, default=str) for run_id in tree]
        logs = [log.message for log in client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=tree)))]
    assert len(tree) >= 3 and logs  # the evaluation, its host rounds and the inference steps
    for text in stored + logs:
        for name, secret in secrets.items():
            assert secret not in text, f"{name} found in a stored parameter or log line"
