"""One ds_config reader: `dsenv doctor --deepspeed-config` and `dsenv smoke --deepspeed-config`
read the same file with dsenv/facts/python/dsconfig.py and give the same verdict on it.

Every file here is real, written to tmp_path; the CLI runs as a user runs it.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from dsenv.facts.python import dsconfig as ds_file
from dsenv.workloads.errors import WorkloadError
from dsenv.workloads.training import dsconfig
from tests.harness import cli
from tests.harness.cli import one_line

TRAIN, MICRO, ACCUM = ds_file.TRAIN, ds_file.MICRO, ds_file.ACCUM
PLANNED = ("--nodes", "2", "--gpus-per-node", "2")  # a world of 4 ranks
WORLD = 4

# (id, file text or None for no file, what a rejection must name)
BAD = [
    ("nan", f'{{"{TRAIN}": NaN, "{MICRO}": 4}}', f"{TRAIN} = NaN is not a number"),
    ("infinity", f'{{"{TRAIN}": Infinity}}', f"{TRAIN} = Infinity is infinite"),
    ("string", f'{{"{MICRO}": "sixteen"}}', f'{MICRO} = "sixteen" is a string'),
    ("negative", f'{{"{MICRO}": 4, "{ACCUM}": -4}}', f"{ACCUM} = -4: it must be"),
    ("zero", f'{{"{MICRO}": 0}}', f"{MICRO} = 0: it must be"),
    ("fraction", f'{{"{TRAIN}": 2.5}}', f"{TRAIN} = 2.5 is not an integer"),
    ("boolean", f'{{"{MICRO}": true}}', f"{MICRO} = true is a boolean"),
    ("missing-file", None, "ds_config.json"),
    ("broken-json", f'{{"{MICRO}": 4,,}}', "not valid JSON (line 1, column"),
    ("duplicate-key", f'{{"{MICRO}": 4, "{MICRO}": 8}}', f"duplicate key '{MICRO}'"),
    ("top-level-array", f'[{{"{MICRO}": 4}}]', "expected a JSON object"),
]
GOOD = [
    ("auto", {TRAIN: "auto", MICRO: "auto", ACCUM: "auto"}),
    ("consistent", {TRAIN: 32, MICRO: 4, ACCUM: 2}),  # 4 x 2 x 4 ranks
    ("derived", {MICRO: 4, ACCUM: 2}),  # DeepSpeed derives train_batch_size
]


def dsenv(*args) -> subprocess.CompletedProcess:
    """`python -m dsenv ARGS` with no GPU visible and outside any Slurm allocation, so the
    world size is the one the test plans (or none)."""
    return cli.dsenv(*args, drop=("SLURM_",), timeout=120,
                     env={"CUDA_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": "",
                          "HIP_VISIBLE_DEVICES": ""})


def _file(tmp_path, text: str | None):
    path = tmp_path / "ds_config.json"
    if text is not None:
        path.write_text(text)
    return path


def _doctor(path, *planned: str) -> tuple[int, dict[str, dict] | str]:
    done = dsenv("doctor", "--only", "job", "--json", "--deepspeed-config", path, *planned)
    if done.returncode == 2:  # bad input: one line, no report
        return 2, one_line(done, "dsenv doctor: ")
    report = json.loads(done.stdout)
    return done.returncode, {r["id"]: r for r in report["results"]}


def _doctor_failure(results: dict[str, dict]) -> str:
    failed = [r for r in results.values() if r["status"] == "fail"]
    assert failed, results
    return " ".join(f"{r['summary']} {r['fix']}" for r in failed)


@pytest.mark.parametrize("text, named", [case[1:] for case in BAD],
                         ids=[case[0] for case in BAD])
@pytest.mark.parametrize("planned", [(), PLANNED], ids=["no-world", "world-4"])
def test_doctor_and_smoke_reject_the_same_files(tmp_path, text, named, planned):
    path = _file(tmp_path, text)

    code, results = _doctor(path, *planned)
    if text is None:
        assert code == 2 and f"{path} is not a file" in results
    else:
        assert code == 1
        assert named in _doctor_failure(results)

    done = dsenv("smoke", "bert-squad", "--deepspeed-config", path, "--output-dir",
                 tmp_path / "out")
    message = one_line(done, "dsenv smoke bert-squad: ")
    assert named in message and str(path) in message

    with pytest.raises(WorkloadError, match="ds_config") as err:
        dsconfig.build_config("fp32", WORLD, on_gpu=False, default_micro_batch=4,
                              default_lr=1e-3, user_config=path)
    assert named in str(err.value)


@pytest.mark.parametrize("config", [case[1] for case in GOOD], ids=[case[0] for case in GOOD])
@pytest.mark.parametrize("planned", [(), PLANNED], ids=["no-world", "world-4"])
def test_doctor_and_workloads_accept_the_healthy_twins(tmp_path, config, planned):
    path = _file(tmp_path, json.dumps(config))
    code, results = _doctor(path, *planned)
    assert code == 0, results
    assert results["job.ds-config"]["status"] == "ok"
    assert results["job.batch-size"]["status"] == ("ok" if planned else "skip")

    assert dsconfig.check_inputs("fp32", path) == config
    planned_config = dsconfig.build_config("fp32", WORLD, on_gpu=False, default_micro_batch=4,
                                           default_lr=1e-3, user_config=path).config
    assert planned_config[TRAIN] == (32 if config[MICRO] != "auto" else 16)


def test_bad_values_name_the_key_and_what_deepspeed_expects(tmp_path):
    config = {TRAIN: float("nan"), MICRO: "sixteen", ACCUM: 0}
    problems = dict(ds_file.batch_problems(config))
    assert problems == {
        TRAIN: f'{TRAIN} = NaN is not a number: it must be a whole number >= 1 or "auto" '
               "(DeepSpeed asserts 'Train batch size: nan has to be greater than 0')",
        MICRO: f'{MICRO} = "sixteen" is a string: it must be a whole number >= 1 or "auto" '
               "(DeepSpeed takes an integer there)",
        ACCUM: f'{ACCUM} = 0: it must be a whole number >= 1 or "auto" (DeepSpeed asserts '
               "'Gradient accumulation steps: 0 has to be greater than 0')"}
    with pytest.raises(ds_file.DsConfigError) as err:
        ds_file.check_batch_values(config, "f.json")
    assert str(err.value).startswith(f"ds_config f.json: {problems[TRAIN]}; set \"{TRAIN}\"")
    assert ds_file.DOCS in str(err.value) and "\n" not in str(err.value)
    assert ds_file.batch_problems({TRAIN: "auto", MICRO: 8, ACCUM: None}) == []


def test_the_doctor_judges_values_before_it_needs_a_world(make_ctx, run_one, tmp_path):
    path = _file(tmp_path, f'{{"{TRAIN}": "sixteen", "{MICRO}": "auto"}}')
    result = run_one("job.batch-size", make_ctx(deepspeed_config=path))
    assert result.status.value == "fail" and result.summary.startswith(f'{TRAIN} = "sixteen"')
    assert result.fix.startswith(f'set "{TRAIN}" to a positive integer')
    assert run_one("job.ds-config", make_ctx(deepspeed_config=path)).status.value == "ok"


@pytest.mark.parametrize("config", [
    {TRAIN: 64, MICRO: 8},  # DeepSpeed derives accumulation 4 on 2 ranks
    {TRAIN: 256, ACCUM: 2},
    {TRAIN: 256},
    {MICRO: 8, ACCUM: 3},
    {TRAIN: 100, MICRO: 8},  # accumulation 6: 96 != 100
    {TRAIN: 256, MICRO: 32, ACCUM: 1},
    {TRAIN: 1},  # micro batch 0 on 2 ranks
])
def test_doctor_and_workloads_agree_on_the_arithmetic(tmp_path, config):
    """With a world size, the smoke's plan and the doctor's verdict accept the same files."""
    path = _file(tmp_path, json.dumps(config))
    verdict = ds_file.judge_batch(config, 2)
    try:
        plan = dsconfig.build_config("fp32", 2, on_gpu=False, default_micro_batch=4,
                                     default_lr=1e-3, user_config=path).batch
    except WorkloadError as exc:
        assert not verdict.good, exc
        assert TRAIN in str(exc)
    else:
        assert verdict.good, verdict.summary
        assert (plan.train_batch_size, plan.micro_batch, plan.grad_accum) == \
            (verdict.train, verdict.micro, verdict.accum)


@pytest.mark.parametrize("train, micro, accum", [
    (64, 8, None), (256, None, 2), (256, None, None), (None, 8, 3), (None, 8, None),
    (100, 8, None), (1, None, None), (32, 4, 2), (512, 32, 1),
    (float("nan"), 4, None), (0, 4, None), (-4, None, None), ("sixteen", None, None),
])
def test_the_arithmetic_is_deepspeeds(train, micro, accum):
    """Against DeepSpeed's own _set_batch_related_parameters and _batch_assertion."""
    config_module = pytest.importorskip("deepspeed.runtime.config")
    engine_config = object.__new__(config_module.DeepSpeedConfig)
    engine_config.world_size = 2
    engine_config.train_batch_size = train
    engine_config.train_micro_batch_size_per_gpu = micro
    engine_config.gradient_accumulation_steps = accum
    try:
        engine_config._configure_train_batch_size()
    except (AssertionError, TypeError):
        deepspeed_takes_it = False
    else:
        deepspeed_takes_it = True
    config = {k: v for k, v in ((TRAIN, train), (MICRO, micro), (ACCUM, accum)) if v is not None}
    verdict = ds_file.judge_batch(config, 2)
    assert verdict.good is deepspeed_takes_it, verdict.summary
    if deepspeed_takes_it:
        assert (verdict.train, verdict.micro, verdict.accum) == (
            engine_config.train_batch_size, engine_config.train_micro_batch_size_per_gpu,
            engine_config.gradient_accumulation_steps)
