"""The HTML reports, looked at in a real browser (headless Chromium in a network namespace of
its own: tests/harness/browser.py): a real bert-squad smoke's page, the doctor's page, and
the distributed doctor's page of a real 2-rank run; each opens from a file with no request
made, and shows what its JSON says. Planted markup (in a host name, in environment values)
renders as text; a secret's value never reaches the file. The full run's page (the test
Hub's data) is looked at in tests/test_workloads_bert_squad_full.py, the 4-host distributed
page with one slowed link in tests/test_multihost_distributed.py."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from tests.harness.browser import look_at, offline_browser, static_requests
from tests.harness.cli import explain, run
from tests.harness.workload_runs import SMOKE, run_dsenv, site_references

REFERENCES = site_references("this test's own table")
PLANT = "<script>document.title='owned'</script><b>bold?</b>"


def nothing_fetched(seen, path, text: str) -> None:
    assert seen.requests == [path.resolve().as_uri()], seen.requests  # the file, nothing else
    assert seen.failed == [] and seen.scripts == 0
    assert static_requests(text) == []


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with offline_browser(tmp_path_factory.mktemp("browser")) as opened:
        yield opened


@pytest.mark.slow
def test_a_smoke_page_shows_its_steps_verdicts_and_answers(tmp_path, run_env, browser):
    (tmp_path / "refs.toml").write_text(REFERENCES)
    result, doc = run_dsenv(tmp_path, run_env, "--steps", "120", "--examples", "2",
                            "--references", str(tmp_path / "refs.toml"), command=SMOKE)
    assert doc is not None, explain(result)
    page = tmp_path / "out" / "report.html"
    assert doc["html_path"] == str(page) and page.is_file()
    assert re.search(r"│ html +/", result.stdout)  # the summary names it
    text = page.read_text()
    seen = look_at(browser, page, screenshot="smoke-bert-squad")
    nothing_fetched(seen, page, text)

    train = doc["training"]
    assert seen.title == "dsenv smoke bert-squad" and seen.verdict == doc["status"]
    assert seen.headline == "; ".join(f"{v['name']} {v['status']}" for v in doc["verdicts"])
    assert seen.details == {v["name"]: v["detail"] for v in doc["verdicts"]}
    # both plots drawn at their size; one point per step
    for plot in ("loss", "throughput"):
        width, height = seen.plots[plot]
        assert width >= 600 and height >= 240, seen.plots
    assert seen.series["loss/train loss"] == train["steps"] == 120
    assert len(train["step_seconds"]) == 120
    assert seen.series["throughput/each step"] == 120
    assert seen.series["throughput/mean of 20 steps"] == 101
    warm = f"warm-up ends (step {train['warmup_steps']})"
    assert seen.vlines == [warm, warm]  # on both plots
    assert seen.bands == ["passes above 10.0 (reference 20 - 50%, this test's own table)"]
    assert seen.measured == [f"after warm-up: {train['samples_per_s_per_device']:.1f} "
                             "(the verdict's value)"]
    # the environment line and the examples as printed: each answer marked in its paragraph
    assert seen.environment.startswith(f"torch {doc['versions']['torch']}, deepspeed "
                                       f"{doc['versions']['deepspeed']}")
    assert "launcher none, world size 1" in seen.environment
    rows = doc["examples"]["rows"]
    assert doc["examples"]["kind"] == "qa" and len(rows) == 2
    assert seen.marked == [r["answer"] for r in rows if r["answer"] and r["start"] >= 0]
    assert all(r["question"] in e for r, e in zip(rows, seen.examples, strict=True))


@pytest.mark.slow
def test_the_page_costs_under_a_second_and_html_options_choose_where(tmp_path, run_env):
    """--html FILE puts it there, --no-html writes none; rendering a real report's page
    (a 500-step smoke's, re-read) takes well under the 1 s the issue allows."""
    from dsenv.workloads.pages import write_run_page

    chosen = tmp_path / "pages" / "mine.html"
    result, doc = run_dsenv(tmp_path, run_env, "--steps", "8", "--html", str(chosen),
                            command=SMOKE, name="chosen")
    assert doc is not None and chosen.is_file(), explain(result)
    assert not (tmp_path / "chosen" / "report.html").exists()
    result, doc = run_dsenv(tmp_path, run_env, "--steps", "8", "--no-html", command=SMOKE,
                            name="none")
    assert doc is not None and doc["html_path"] is None, explain(result)
    assert not list((tmp_path / "none").glob("*.html"))
    # the cost, on a report with 500 steps (a default smoke's length)
    long = {**doc, "training": {**doc["training"], "loss_curve": [1.0 / (i + 1) for i in
                                                                   range(500)],
                                "step_seconds": [0.05] * 500, "steps": 500}}
    started = time.perf_counter()
    write_run_page(long, tmp_path / "long.html")
    assert time.perf_counter() - started < 1.0


def test_the_doctor_page_matches_its_json_and_keeps_planted_markup_as_text(tmp_path, run_env,
                                                                          browser):
    secret = "s3cr3t-value-4711"
    env = {**run_env, "MY_API_TOKEN": secret,
           "NCCL_SOCKET_IFNAME": f"<script>alert('{secret}')</script>"}
    page = tmp_path / "doctor.html"
    done = run([sys.executable, "-m", "dsenv", "doctor", "--json", "--html", str(page)],
               timeout=120, env=env, cwd=tmp_path)
    report = json.loads(done.stdout)
    text = page.read_text()
    assert secret not in text and "***" in text
    seen = look_at(browser, page, screenshot="doctor")
    nothing_fetched(seen, page, text)
    assert seen.verdict == ("READY" if report["verdict"]["ready"] else "NOT READY")
    assert seen.headline == report["verdict"]["line"]
    attention = [r["id"] for r in report["results"] if r["status"] in ("warn", "fail", "error")]
    assert attention and seen.findings == attention
    assert seen.areas == list(dict.fromkeys(r["area"] for r in report["results"]))
    # the interface variable's value is shown by the comm checks, as text
    assert "<script>alert('***')</script>" in seen.body
    assert seen.title == f"dsenv doctor on {report['host']}"


@pytest.mark.slow
def test_a_distributed_page_draws_busbw_ranks_and_hosts(tmp_path, run_env, browser):
    """A real 2-rank run (torchrun, gloo on loopback); then the same report with a host
    renamed to markup, as a hostile host name would arrive."""
    page = tmp_path / "distributed.html"
    done = run([sys.executable, "-m", "dsenv", "doctor", "--distributed", "--launch",
                "torchrun", "-n", "2", "--only", "distributed", "--json", "--html",
                str(page)], timeout=180, env=run_env, cwd=tmp_path)
    assert done.returncode == 0, explain(done)
    report = json.loads(done.stdout)
    dist = report["distributed"]
    seen = look_at(browser, page, screenshot="doctor-distributed")
    nothing_fetched(seen, page, page.read_text())
    width, height = seen.plots["busbw"]
    assert width >= 600 and height >= 240
    largest = dist["allreduce"][-1]
    assert seen.marks == [f"the verdict reads {largest['busbw_gbps']:.2f} GB/s at "
                          f"{_size(largest['bytes'])}"]
    assert "ranks" in seen.plots and "pairs" not in seen.plots  # one host: no pairs
    assert "all ranks on one host: no host pairs" in seen.body
    for rank in dist["ranks"]:
        assert set(rank["phases"]) == {"rendezvous_s", "init_s", "check_s", "bandwidth_s"}
        assert rank["arrived_epoch"] > 0
    assert re.search(r"\n0\tvm|\n0\t", seen.body)  # the ranks table lists rank 0

    from dsenv.doctor import page as doctor_page
    from dsenv.doctor.distributed import page as distributed_page

    hostile = json.loads(json.dumps(report).replace(f'"{report["host"]}"',
                                                    json.dumps(PLANT)))
    planted = tmp_path / "planted.html"
    doctor_page.write(planted, hostile, distributed_page.sections(hostile))
    seen = look_at(browser, planted)
    nothing_fetched(seen, planted, planted.read_text())
    assert seen.title == f"dsenv doctor on {PLANT}"  # the title as text, not run
    assert PLANT in seen.body


def _size(n: int) -> str:
    from dsenv.doctor.distributed.ranks import format_size

    return format_size(n)


@pytest.mark.slow
def test_a_failed_distributed_run_still_writes_its_page_with_the_failure(tmp_path, run_env,
                                                                         browser):
    """Rank 1 exits during the all-reduce check (the test hook): the page says NOT READY,
    the failing finding is there with its fix, and the plots say what they lack."""
    page = tmp_path / "failed.html"
    env = {**run_env, "DSENV_DISTRIBUTED_TEST_FAULT": "exit:1@check"}
    done = run([sys.executable, "-m", "dsenv", "doctor", "--distributed", "--launch",
                "torchrun", "-n", "2", "--only", "distributed", "--timeout", "20", "--json",
                "--html", str(page)], timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 1, explain(done)
    report = json.loads(done.stdout)
    failing = [r["id"] for r in report["results"] if r["status"] in ("fail", "error", "warn")]
    seen = look_at(browser, page, screenshot="doctor-distributed-failed")
    nothing_fetched(seen, page, page.read_text())
    assert seen.verdict == "NOT READY" and seen.headline == report["verdict"]["line"]
    assert failing and seen.findings == failing
    assert "fix:" in seen.body
    assert "no data for all-reduce" in seen.body  # the busbw plot, empty, says so
