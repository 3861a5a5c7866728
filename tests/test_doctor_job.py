"""job area: real ds_config files (bert-squad fp16 and ZeRO-2, eth-cscs t5, HF "auto")."""

from __future__ import annotations

import json

import pytest

from dsenv.facts.gpu.inventory import Gpu, visible_gpus
from dsenv.facts.python import dsconfig
from dsenv.verdicts.findings import Status
from tests.harness.findings import here
from tests.harness.recorded import FIXTURES

CONFIGS = FIXTURES / "dsconfig"
FP16 = CONFIGS / "bert_squad_fp16.json"
ZERO2 = CONFIGS / "bert_squad_zero2.json"
AUTO = CONFIGS / "hf_zero2_auto.json"
V100 = Gpu("nvidia", 0, "Tesla V100-SXM2-32GB", "7.0", 32768)
A100 = Gpu("nvidia", 0, "NVIDIA A100-SXM4-80GB", "8.0", 81920)
MI100 = Gpu("amd", 0, "AMD Instinct MI100", "gfx908", 32752)


def with_gpus(ctx, gpus):
    ctx.memo(visible_gpus.memo_key, lambda: list(gpus))
    return ctx


def variant(tmp_path, source, **changes):
    data = json.loads(source.read_text())
    data.update(changes)
    path = tmp_path / f"variant-{source.name}"
    path.write_text(json.dumps(data, indent=4))
    return path


def test_ds_config_parses(make_ctx, run_one):
    result = run_one("job.ds-config", make_ctx(deepspeed_config=ZERO2))
    assert result.status == Status.OK and "6 top-level keys" in result.summary


def test_ds_config_syntax_error_names_line_and_column(tmp_path, make_ctx, run_one):
    broken = tmp_path / "ds_config.json"
    broken.write_text(FP16.read_text().replace('"gradient_accumulation_steps": 1,',
                                               '"gradient_accumulation_steps": 1'))
    result = run_one("job.ds-config", make_ctx(deepspeed_config=broken))
    assert result.status == Status.FAIL
    assert result.summary == (f"ds_config {broken}: not valid JSON (line 4, column 5: "
                              "Expecting ',' delimiter)")
    assert f"python -m json.tool {broken}" in result.fix


def test_ds_config_duplicate_key_fails(tmp_path, make_ctx, run_one):
    doubled = tmp_path / "ds_config.json"
    doubled.write_text(FP16.read_text().replace('"steps_per_print": 10,',
                                                '"steps_per_print": 10, "fp16": {},'))
    result = run_one("job.ds-config", make_ctx(deepspeed_config=doubled))
    assert result.status == Status.FAIL and "duplicate key 'fp16'" in result.summary


def test_no_config_skips_with_reason(make_ctx, run_one, monkeypatch):
    from dsenv.workloads import cli

    assert "--deepspeed-config" in run_one("job.batch-size", make_ctx()).summary
    monkeypatch.delitem(cli.WORKLOAD_MODULES, "t5-xsum")  # a workload without a full run
    result = run_one("job.precision", make_ctx(workload="t5-xsum"))
    assert result.status == Status.SKIP and "t5-xsum has no full run" in result.summary


@pytest.mark.parametrize("workload", ["t5-xsum", "gpt2-wikitext", "bert-mrpc"])
def test_every_workload_without_config_judges_its_full_run(make_ctx, run_one, workload):
    import importlib

    from dsenv.workloads.cli import WORKLOAD_MODULES

    full = importlib.import_module(WORKLOAD_MODULES[workload]).FULL
    result = run_one("job.ds-config", make_ctx(workload=workload))
    assert result.status == Status.OK and f"dsenv run {workload} --preset fp32" in result.summary
    result = run_one("job.batch-size", make_ctx(workload=workload, nodes=2, gpus_per_node=4))
    assert result.status == Status.OK
    assert result.summary == f"{full.micro_batch * 8} = {full.micro_batch} x 1 x 8 ranks"


def test_workload_without_config_judges_its_default_preset(make_ctx, run_one):
    from dsenv.workloads.bert_squad import FULL

    ctx = make_ctx(workload="bert-squad", nodes=2, gpus_per_node=4)
    result = run_one("job.ds-config", ctx)
    assert result.status == Status.OK and "dsenv run bert-squad --preset fp32" in result.summary
    result = run_one("job.batch-size", make_ctx(workload="bert-squad", nodes=2, gpus_per_node=4))
    micro = FULL.micro_batch
    assert result.status == Status.OK
    assert result.summary == f"{micro * 8} = {micro} x 1 x 8 ranks"
    result = run_one("job.precision", with_gpus(make_ctx(workload="bert-squad"), [V100]))
    assert result.status == Status.OK and result.summary.startswith("fp32")


def test_batch_size_fits_planned_world(make_ctx, run_one):
    # train_batch_size 512 on 2 nodes x 4 MI100 = 8 ranks -> micro batch 64
    result = run_one("job.batch-size", make_ctx(deepspeed_config=FP16, nodes=2, gpus_per_node=4))
    assert result.status == Status.OK and result.summary == "512 = 64 x 1 x 8 ranks"


def test_batch_size_does_not_split_fails(make_ctx, run_one):
    result = run_one("job.batch-size", make_ctx(deepspeed_config=FP16, nodes=2, gpus_per_node=3))
    assert result.status == Status.FAIL
    assert "512 != 85 x 1 x 6 = 510" in result.summary
    assert here(result).startswith('set "train_batch_size": 510 or 516')


def test_batch_size_from_slurm_allocation(make_ctx, run_one):
    env = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "4"}
    result = run_one("job.batch-size", make_ctx(env=env, deepspeed_config=FP16))
    assert result.status == Status.OK
    assert "SLURM_NNODES 2 x SLURM_NTASKS_PER_NODE 4" in result.evidence[0]


def test_batch_size_world_unknown_skips(make_ctx, run_one):
    result = run_one("job.batch-size", with_gpus(make_ctx(deepspeed_config=FP16), []))
    assert result.status == Status.SKIP and "--nodes N --gpus-per-node G" in result.summary


def test_batch_size_hf_auto_ok(make_ctx, run_one):
    result = run_one("job.batch-size", make_ctx(deepspeed_config=AUTO, nodes=2, gpus_per_node=4))
    assert result.status == Status.OK and "Hugging Face Trainer" in result.summary


@pytest.mark.parametrize("config, world, good, fix", [
    # all three given and inconsistent: both ways out
    ({"train_batch_size": 512, "train_micro_batch_size_per_gpu": 32,
      "gradient_accumulation_steps": 1}, 8, False,
     'set "train_batch_size": 256, or keep 512 with "train_micro_batch_size_per_gpu": 64, '
     '"gradient_accumulation_steps": 1'),
    # train + micro: accumulation = 512 // 64 // 16 = 0
    ({"train_batch_size": 512, "train_micro_batch_size_per_gpu": 64}, 16, False,
     'set "train_batch_size": 1024, or keep 512 with "train_micro_batch_size_per_gpu": 32, '
     '"gradient_accumulation_steps": 1'),
    ({"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 4}, 8, True, None),
    ({"train_micro_batch_size_per_gpu": 16}, 3, True, None),
    ({"gradient_accumulation_steps": 4}, 8, False, 'add "train_micro_batch_size_per_gpu": '
     '<per-GPU batch>'),
    ({"train_batch_size": 100, "train_micro_batch_size_per_gpu": "auto"}, 8, False,
     'set "train_batch_size": "auto" (or a multiple of 8)'),
])
def test_judge_batch_follows_deepspeed(config, world, good, fix):
    verdict = dsconfig.judge_batch(config, world)
    assert verdict.good is good
    assert verdict.fix == fix


def test_precision_fp16_on_v100_ok(make_ctx, run_one):
    ctx = with_gpus(make_ctx(deepspeed_config=ZERO2), [V100])
    result = run_one("job.precision", ctx)
    assert result.status == Status.OK and result.summary == "fp16 on 7.0"


def test_precision_bf16_on_v100_fails_on_a100_ok(tmp_path, make_ctx, run_one):
    bf16 = variant(tmp_path, ZERO2, fp16={"enabled": False}, bf16={"enabled": True})
    result = run_one("job.precision", with_gpus(make_ctx(deepspeed_config=bf16), [V100, V100]))
    assert result.status == Status.FAIL and "7.0" in result.summary
    assert here(result).startswith("switch to fp16")
    assert run_one("job.precision",
                   with_gpus(make_ctx(deepspeed_config=bf16), [A100])).status == Status.OK
    # the old section name DeepSpeed still reads, on MI100 (gfx908: no bf16)
    old = variant(tmp_path, FP16, fp16={"enabled": False}, bfloat16={"enabled": True})
    result = run_one("job.precision", with_gpus(make_ctx(deepspeed_config=old), [MI100]))
    assert result.status == Status.FAIL and "gfx908" in result.summary


def test_precision_both_enabled_fails(tmp_path, make_ctx, run_one):
    both = variant(tmp_path, FP16, bf16={"enabled": True})
    result = run_one("job.precision", with_gpus(make_ctx(deepspeed_config=both), []))
    assert result.status == Status.FAIL and "simultaneously" in result.summary


def test_precision_no_gpu_skips(make_ctx, run_one):
    result = run_one("job.precision", with_gpus(make_ctx(deepspeed_config=FP16), []))
    assert result.status == Status.SKIP
