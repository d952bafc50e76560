"""What a vendor reads when its image fails: the in-image probe's torchless answer and a failed build, each in
one line naming the Dockerfile (and for a build, the instruction's line and its last output)."""

from __future__ import annotations

import json
from pathlib import Path

from flagperf.hosts.buildlog import BuildTranscript, instruction_lines
from flagperf.hosts.health import image_probe_check
from flagperf.hosts.vendorscaffold import write_vendor_folder


def test_an_image_without_torch_says_so_naming_the_dockerfile() -> None:
    answer = {"torch_missing": "ModuleNotFoundError: No module named 'torch'", "python_executable": "/usr/bin/python3",
              "libraries": {"torch": "not installed"}}
    check, probe = image_probe_check(["starting", json.dumps(answer)], 0, False, "flagperf/acme-pytorch:0123",
                                     "vendor_images/acme/pytorch/Dockerfile")
    assert not check.ok and probe == answer and "\n" not in check.detail
    assert check.detail == ("flagperf/acme-pytorch:0123 (built from vendor_images/acme/pytorch/Dockerfile) has no "
                            "torch: its /usr/bin/python3 cannot import torch (ModuleNotFoundError: No module named "
                            "'torch'); install the vendor's torch in vendor_images/acme/pytorch/Dockerfile (its "
                            "BASE_IMAGE or a RUN line)")
    crashed, _ = image_probe_check(["ModuleNotFoundError: No module named 'pydantic'"], 1, False, "img:1",
                                   "d/Dockerfile")
    assert crashed.detail == "the probe in img:1 (built from d/Dockerfile) exited 1: ModuleNotFoundError: No module " \
                             "named 'pydantic'"


def test_instruction_lines_follow_the_builders_steps() -> None:
    text = "# syntax\nARG BASE=x\n\nFROM ${BASE}\n# comment\nRUN a \\\n  # inside\n  && b\nCOPY x /y\n"
    assert instruction_lines(text) == [2, 4, 6, 9]


def test_a_failed_build_names_the_dockerfile_line_and_the_last_output(tmp_path: Path) -> None:
    folder = write_vendor_folder(tmp_path, "acme")
    dockerfile = folder / "pytorch" / "Dockerfile"
    seen: list[str] = []
    transcript = BuildTranscript(seen.append)
    for line in ["Step 1/4 : ARG BASE_IMAGE=python:3.11-slim-bookworm", "Step 2/4 : FROM ${BASE_IMAGE}",
                 " ---> 26dc99604ac2", "Step 3/4 : COPY requirements.txt pytorch_install.sh /opt/flagperf/",
                 " ---> 1b2c", "Step 4/4 : RUN bash /opt/flagperf/pytorch_install.sh",
                 " ---> Running in 5e6f", "Collecting torch-acme==9.9",
                 "ERROR: No matching distribution found for torch-acme==9.9"]:
        transcript(line)
    assert len(seen) == 9  # every line still reaches the task's log
    message = transcript.failure(dockerfile, "building flagperf/acme-pytorch:ab failed: The command '/bin/sh -c "
                                             "bash /opt/flagperf/pytorch_install.sh' returned a non-zero code: 1")
    run_line = dockerfile.read_text().splitlines().index("RUN bash /opt/flagperf/pytorch_install.sh") + 1
    assert message.startswith(f"image build failed at {dockerfile} line {run_line} (RUN bash "
                              "/opt/flagperf/pytorch_install.sh): building flagperf/acme-pytorch:ab failed:")
    assert message.endswith("its last output: Collecting torch-acme==9.9 | ERROR: No matching distribution found "
                            "for torch-acme==9.9") and "\n" not in message


def test_a_container_the_engine_refused_says_it_did_not_start_and_why() -> None:
    """What the test bed's engine (no CAP_SYS_RESOURCE) answered to a vendor's ulimits memlock: -1."""
    refused = ("container engine error: failed to create shim task: OCI runtime create failed: runc create failed: "
               "unable to start container process: error during container init: error setting rlimits for ready "
               "process: error setting rlimit type 8: operation not permitted: unknown")
    check, probe = image_probe_check([refused], None, False, "img:1", "d/Dockerfile")
    assert probe is None and not check.ok
    assert check.detail.startswith("the container for the probe in img:1 (built from d/Dockerfile) did not start: "
                                   "container engine error: failed to create shim task")
    assert check.detail.endswith("; the engine could not apply the vendor's container.ulimits (raising a limit "
                                 "needs CAP_SYS_RESOURCE where the engine runs)")


def test_a_probe_the_link_lost_says_the_link_was_lost_not_that_the_engine_refused_it() -> None:
    """The link to a host's engine drops as the probe's container starts: the check says the probe was lost and why,
    not that the container did not start (which reads as the engine refusing the vendor's container options)."""
    link = ("the link to h2's container engine dropped while starting container flagperf-probe-h2 (ConnectionError: "
            "('Connection aborted.', ConnectionResetError(104)))")
    check, probe = image_probe_check([f"[flagperf] {link}"], None, False, "img:1", "d/Dockerfile", link)
    assert probe is None and not check.ok
    assert check.detail == f"the probe in img:1 (built from d/Dockerfile) was lost: {link}", check.detail
