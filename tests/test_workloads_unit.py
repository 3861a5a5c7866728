"""Workload machinery without a DeepSpeed engine: ranks, configs, SQuAD files, verdicts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dsenv.jsonfiles import write_json_atomically
from dsenv.workloads import report, squad
from dsenv.workloads.launch.env import WorkloadError, apply, discover, first_host
from dsenv.workloads.training import dsconfig


# ----------------------------------------------------------------------------- ranks
@pytest.mark.parametrize("env, launcher, rank, local_rank, world, local_size", [
    ({}, "none", 0, 0, 1, 1),
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "CROSS_RANK": "1", "LOCAL_SIZE": "2",
      "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}, "deepspeed", 3, 1, 4, 2),
    ({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
      "TORCHELASTIC_RUN_ID": "x", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
      "MASTER_PORT": "1234"}, "torchrun", 1, 1, 2, 2),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
      "MASTER_ADDR": "n0"}, "mpirun", 5, 1, 8, 4),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2",
      "MASTER_ADDR": "n0"}, "mpirun", 2, 0, 4, 2),
    ({"SLURM_PROCID": "6", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_ID": "0",
      "SLURM_LOCALID": "2", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
      "SLURM_STEP_NODELIST": "nid[0007-0008]", "SLURM_JOB_ID": "4242"}, "srun", 6, 2, 8, 4),
    # mpirun inside an allocation: ranks inherit the daemon's SLURM_PROCID; MPI wins
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
      "SLURM_PROCID": "0", "SLURM_STEP_ID": "1", "SLURM_NTASKS": "1"}, "mpirun", 1, 1, 2, 2),
    # a batch script running python without srun: one process, not rank 0 of 4
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"}, "none", 0, 0, 1, 1),
])
def test_discover_every_launcher(env, launcher, rank, local_rank, world, local_size):
    info = discover(env)
    assert (info.launcher, info.rank, info.local_rank, info.world_size, info.local_size) == \
        (launcher, rank, local_rank, world, local_size)


def test_master_address_defaults_only_when_missing():
    assert discover({}).master_addr == "127.0.0.1"
    one_node = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert discover(one_node).master_addr == "127.0.0.1"
    assert discover(one_node).master_port == 29500
    assert discover({**one_node, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "4000"}) \
        .master_addr == "10.0.0.5"
    srun = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "0",
            "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_NODELIST": "gpu[12-13]",
            "SLURM_JOB_ID": "4242"}
    info = discover(srun)
    assert (info.master_addr, info.master_port) == ("gpu12", 20000 + 4242)
    # two nodes under mpirun and no MASTER_ADDR: unknown (resolved over MPI or refused)
    multi = {**one_node, "OMPI_COMM_WORLD_SIZE": "4"}
    assert discover(multi).master_addr is None
    with pytest.raises(WorkloadError, match="MASTER_ADDR"):
        apply(discover(multi), {})


def test_apply_exports_torch_variables_and_keeps_master():
    env = {"MASTER_ADDR": "127.0.0.1", "OMPI_COMM_WORLD_RANK": "1",
           "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    apply(discover(env), env)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                "MASTER_PORT")} == {
        "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500"}


def test_single_process_leaves_the_port_to_the_kernel_not_29500():
    # 0: the store binds and the kernel picks, so no other process can take the port between
    # choosing and binding (a free port chosen first lost that race in CI: EADDRINUSE)
    assert discover({}).master_port == 0
    assert discover({"MASTER_PORT": "29611"}).master_port == 29611


@pytest.mark.parametrize("env, message", [
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "not within world size"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "not a whole number"),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK"),
])
def test_bad_rank_variables(env, message):
    with pytest.raises(WorkloadError, match=message):
        discover(env)


def test_first_host_of_slurm_hostlists():
    assert first_host("nid[0007-0010,0012],gpu1") == "nid0007"
    assert first_host("node5") == "node5"
    assert first_host("a1,b2") == "a1"


# ----------------------------------------------------------------------------- configs
def build(**kw):
    args = {"world_size": 1, "on_gpu": False, "default_micro_batch": 16, "default_lr": 1e-3}
    args.update(kw)
    preset = args.pop("preset", "fp32")
    return dsconfig.build_config(preset, **args)


def test_presets_are_data_and_all_named():
    assert set(dsconfig.preset_names()) == {"fp32", "fp16", "bf16", "zero1", "zero2", "zero3",
                                            "zero3-offload"}


def test_batch_is_derived_from_micro_batch_accumulation_and_world():
    planned = build(world_size=4, grad_accum=2)
    assert planned.config["train_batch_size"] == 16 * 2 * 4
    assert planned.config["train_micro_batch_size_per_gpu"] == 16
    assert planned.config["gradient_accumulation_steps"] == 2
    assert planned.batch.describe() == "128 = micro-batch 16 x grad-accum 2 x world size 4"


def test_user_config_merges_over_preset(tmp_path):
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8,
                                "zero_optimization": {"stage": 2},
                                "optimizer": {"params": {"lr": 5e-5, "betas": [0.9, 0.98]}},
                                "gradient_clipping": 1.0}))
    planned = build(user_config=user, world_size=2)
    config = planned.config
    assert config["train_batch_size"] == 16 and config["gradient_clipping"] == 1.0
    assert config["zero_optimization"]["stage"] == 2
    assert config["optimizer"]["type"] == "AdamW"  # from the preset
    assert config["optimizer"]["params"]["lr"] == 5e-5 and planned.base_lr == 5e-5
    assert config["optimizer"]["params"]["weight_decay"] == 0.01


def test_user_train_batch_size_that_contradicts_the_world_is_rejected(tmp_path):
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 32,
                                "gradient_accumulation_steps": 1}))
    with pytest.raises(WorkloadError) as err:
        build(user_config=user, world_size=2)
    assert str(err.value) == ("ds_config train_batch_size 256 contradicts this run: micro-batch "
                              "32 x grad-accum 1 x world size 2 = 64; drop train_batch_size "
                              "(dsenv derives it)")
    assert build(user_config=user, world_size=8).config["train_batch_size"] == 256


def test_user_train_batch_size_alone_is_split_over_the_world(tmp_path):
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"train_batch_size": 256}))  # seed 000's config
    assert build(user_config=user, world_size=8).batch.micro_batch == 32
    with pytest.raises(WorkloadError, match="cannot be split over grad-accum 1 x world size 3"):
        build(user_config=user, world_size=3)
    user.write_text(json.dumps({"train_batch_size": "auto"}))  # HF's "auto" = not given
    assert build(user_config=user, world_size=3).config["train_batch_size"] == 48


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", r"not valid JSON \(line 1, column 2"),
    ("[1, 2]", "expected a JSON object"),
    ('{"train_micro_batch_size_per_gpu": 0}', "must be a whole number >= 1"),
])
def test_bad_user_configs(tmp_path, content, message):
    user = tmp_path / "ds.json"
    if content is not None:
        user.write_text(content)
    with pytest.raises(WorkloadError, match=message):
        build(user_config=user)


def test_unknown_preset_and_fp16_on_cpu():
    with pytest.raises(WorkloadError, match="unknown preset 'zero4'; choose one of fp32"):
        build(preset="zero4")
    with pytest.raises(WorkloadError, match="fp16 needs a GPU"):
        build(preset="fp16")
    assert build(preset="fp16", on_gpu=True).config["fp16"]["enabled"] is True


@pytest.mark.parametrize("scaling, expected", [("none", 1e-3), ("linear", 4e-3),
                                               ("sqrt", 2e-3)])
def test_lr_scaling(scaling, expected):
    planned = build(world_size=4, lr_scaling=scaling)
    assert planned.lr == pytest.approx(expected)
    assert planned.config["optimizer"]["params"]["lr"] == pytest.approx(expected)
    assert planned.base_lr == 1e-3


def test_cpu_uses_torch_adam_but_offload_keeps_cpu_adam():
    assert build().config["optimizer"]["params"]["torch_adam"] is True
    assert dsconfig.required_ops(build().config, on_gpu=False) == ["deepspeed_shm_comm"]
    offload = build(preset="zero3-offload").config
    assert "torch_adam" not in offload["optimizer"]["params"]
    assert dsconfig.required_ops(offload, on_gpu=False) == ["deepspeed_shm_comm", "cpu_adam"]
    gpu = build(on_gpu=True).config
    assert "torch_adam" not in gpu["optimizer"]["params"]
    assert dsconfig.required_ops(gpu, on_gpu=True) == ["fused_adam"]
    # one rank on a CPU has no peer to reduce with: no shm_comm (issue 24)
    assert dsconfig.required_ops(build().config, on_gpu=False, world_size=1) == []
    assert dsconfig.required_ops(offload, on_gpu=False, world_size=1) == ["cpu_adam"]


def test_scheduler_added_with_the_effective_lr():
    config = build(lr=2e-3, warmup_steps=10, total_steps=100).config
    assert config["scheduler"]["params"]["warmup_max_lr"] == 2e-3
    assert config["scheduler"]["params"]["total_num_steps"] == 100


def test_required_ops_against_the_jit_cache(tmp_path, monkeypatch):
    """A missing op is announced before the first run builds it, with the cache dir."""
    from dsenv.workloads.training import engine

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    config = build(preset="zero3-offload").config
    assert [op for op, _ in engine.ops_to_build(config, on_gpu=False)] == \
        ["deepspeed_shm_comm", "cpu_adam"]
    built = tmp_path / "ext" / "deepspeed_shm_comm"
    (built / "deepspeed_shm_comm.so").write_bytes(b"")
    missing = engine.ops_to_build(config, on_gpu=False)
    assert [(op, path.name) for op, path in missing] == [("cpu_adam", "cpu_adam")]


# ----------------------------------------------------------------------------- SQuAD files
def test_synthetic_data_is_squad_v11_layout_and_round_trips(tmp_path):
    doc = squad.synthetic_squad(20, seed=3)
    assert doc["version"] == "1.1" and set(doc["data"][0]) == {"title", "paragraphs"}
    para = doc["data"][0]["paragraphs"][0]
    assert set(para) == {"context", "qas"}
    assert set(para["qas"][0]) == {"answers", "question", "id"}
    assert set(para["qas"][0]["answers"][0]) == {"answer_start", "text"}
    path = tmp_path / "dev-v1.1.json"
    write_json_atomically(path, doc)
    examples = squad.read_squad(path)
    assert len(examples) == 20 * squad.FACTS_PER_PARAGRAPH
    for ex in examples:
        answer = ex.answers[0]
        assert ex.context[answer.start:answer.start + len(answer.text)] == answer.text
    assert squad.synthetic_squad(20, seed=3) == doc  # deterministic


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ('{"data": [', "not valid JSON"),
    ('{"version": "1.1"}', "top level: no 'data' list"),
    ('{"data": [{"title": "x"}]}', r"data\[0\]: no 'paragraphs' list"),
    ('{"data": [{"paragraphs": [{"context": "abc", "qas": [{"id": "1", "question": "q?", '
     '"answers": [{"text": "abc"}]}]}]}]}',
     r"data\[0\].paragraphs\[0\].qas\[0\].answers\[0\]: needs 'text' and integer"),
    ('{"data": [{"paragraphs": [{"context": "abc", "qas": [{"id": "1", "question": "q?", '
     '"answers": []}]}]}]}', "no answers"),
    ('{"data": []}', "no questions in it"),
])
def test_malformed_squad_files(tmp_path, content, message):
    path = tmp_path / "train-v1.1.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(WorkloadError, match=message) as err:
        squad.read_squad(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def tokenizer():
    from dsenv.workloads.tiny import train_wordpiece

    examples = [ex for ex in _examples(40)]
    return train_wordpiece([e.context for e in examples] + [e.question for e in examples], 400)


def _examples(paragraphs):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.json"
        write_json_atomically(path, squad.synthetic_squad(paragraphs, seed=5))
        return squad.read_squad(path)


def test_tokenizer_is_a_transformers_fast_tokenizer(tokenizer):
    assert tokenizer.is_fast and tokenizer.cls_token == "[CLS]"
    assert tokenizer.tokenize("Where does Zoe live?") == ["where", "does", "zoe", "live", "?"]


@pytest.mark.parametrize("max_length, stride", [(64, 16), (24, 4)])
def test_offsets_to_positions_and_back_with_doc_stride(tokenizer, max_length, stride):
    """Gold positions fed back as logits give back the gold answers: EM 100, also when
    short windows (max length 24) split the context with overlap."""
    import numpy as np

    examples = _examples(40)
    train = squad.train_features(examples, tokenizer, max_length, stride, max_query_length=12)
    evals = squad.eval_features(examples, tokenizer, max_length, stride, max_query_length=12)
    n = len(evals["input_ids"])
    assert n == len(train["input_ids"])
    if max_length == 24:
        assert n > len(examples)  # windows, and some without the answer (-> [CLS])
        assert 0 in train["start_positions"]
    else:
        assert n == len(examples)
    start, end = np.full((n, max_length), -9.0), np.full((n, max_length), -9.0)
    for i, (s, e) in enumerate(zip(train["start_positions"], train["end_positions"], strict=True)):
        if s:
            start[i, s], end[i, e] = 5.0, 5.0
    answers = squad.best_answers(examples, evals, start, end)
    scores = squad.squad_scores(examples, {k: v[0] for k, v in answers.items()})
    assert scores == {"exact_match": 100.0, "f1": 100.0}
    for ex in examples:
        text, begin = answers[ex.id]
        assert ex.context[begin:begin + len(text)] == text


def test_highlight_marks_the_answer_in_its_paragraph():
    text = squad.highlight("Oscar lives in rome.", 15, 4)
    assert text.plain == "Oscar lives in rome."
    assert [(span.start, span.end) for span in text.spans] == [(15, 19)]


# ----------------------------------------------------------------------------- verdicts
def test_sanity_needs_both_the_loss_drop_and_the_metric():
    falling = [4.0] * 10 + [0.1] * 30
    thresholds = {"min_loss_drop": 0.5, "min_exact_match": 60.0, "min_f1": 65.0}
    ok = report.sanity_verdict(falling, {"exact_match": 97.0, "f1": 98.0}, thresholds)
    assert ok.status == "PASS"
    flat = report.sanity_verdict([4.0] * 40, {"exact_match": 97.0, "f1": 98.0}, thresholds)
    assert flat.status == "FAIL" and "loss drop 0 < 0.5" in flat.detail
    dumb = report.sanity_verdict(falling, {"exact_match": 4.5, "f1": 7.0}, thresholds)
    assert dumb.status == "FAIL" and "exact_match 4.5 < 60" in dumb.detail


def test_performance_against_references_per_device():
    refs = {"w": [{"device": "NVIDIA H100*", "samples_per_s": 100, "tolerance": 0.2},
                  {"device": "NVIDIA H100 80GB HBM3", "preset": "bf16", "samples_per_s": 200,
                   "tolerance": 0.1}]}
    # 4 devices: per-device = 1/4 of the global figure
    assert report.performance_verdict(400, 4, "NVIDIA H100 80GB HBM3", "fp32", "w",
                                      refs).status == "PASS"
    slow = report.performance_verdict(280, 4, "NVIDIA H100 80GB HBM3", "fp32", "w", refs)
    assert slow.status == "FAIL" and "70.0 per device" in slow.detail
    # the more specific bf16 entry wins: 190/1 < 200 x 0.9 = 180? no: 190 >= 180
    assert report.performance_verdict(190, 1, "NVIDIA H100 80GB HBM3", "bf16", "w",
                                      refs).status == "PASS"
    assert report.performance_verdict(170, 1, "NVIDIA H100 80GB HBM3", "bf16", "w",
                                      refs).status == "FAIL"
    unknown = report.performance_verdict(10, 1, "cpu:Some CPU", "fp32", "w", refs)
    assert unknown.status == "REPORTED" and "reported only" in unknown.detail
    assert report.overall([unknown, unknown]) == "PASS"


def test_shipped_references_parse_and_cover_the_smoke():
    refs = report.load_references()
    assert report.find_reference(refs, "bert-squad-smoke", "cpu:AMD EPYC", 1, "fp32")
    assert report.find_reference(refs, "bert-squad-full", "AMD Instinct MI100", 8, "fp32")
    from dsenv.workloads import bert_mrpc, gpt2_wikitext, t5_xsum

    for module in (t5_xsum, gpt2_wikitext, bert_mrpc):  # every smoke's key has a reference
        assert report.find_reference(refs, module.SMOKE.perf_key, "cpu:AMD EPYC", 1, "fp32")
    seed_002 = report.find_reference(refs, t5_xsum.FULL.perf_key, "AMD Instinct MI100", 8,
                                     "zero3-offload")
    assert seed_002["samples_per_s"] * 8 == pytest.approx(3480)


# ----------------------------------------------------------------------------- saving
def test_staged_dir_swaps_and_clears_leftovers(tmp_path):
    from dsenv.staging import staged_dir

    target = tmp_path / "model"
    target.mkdir()
    (target / "old.txt").write_text("old")
    stale = tmp_path / ".model.tmp-999"  # an interrupted earlier save
    stale.mkdir()
    (stale / "half.bin").write_text("half-written")
    with staged_dir(target) as tmp:
        assert not stale.exists() and (target / "old.txt").exists()
        (tmp / "config.json").write_text("{}")
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_staged_dir_failure_keeps_old_target_and_leaves_nothing(tmp_path):
    from dsenv.staging import staged_dir

    target = tmp_path / "model"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), staged_dir(target) as tmp:
        (tmp / "half.bin").write_text("half")
        raise RuntimeError("killed mid-save")
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


# ----------------------------------------------------------------------------- CLI
def test_cli_imports_no_torch():
    code = ("import sys, argparse, dsenv.workloads.cli as c; p = argparse.ArgumentParser(); "
            "c.add_workload_parsers(p.add_subparsers(dest='command')); "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'deepspeed', 'transformers', 'tokenizers', 'datasets')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_smoke_help_lists_presets_and_hides_test_flags():
    out = subprocess.run([sys.executable, "-m", "dsenv.workloads.cli", "smoke", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "zero3-offload" in out.stdout and "--lr-scaling" in out.stdout
    assert "--shuffle-labels" not in out.stdout and "--steps" not in out.stdout


def test_jit_builds_use_this_environments_ninja(tmp_path, monkeypatch):
    """Debian's mpirun -x PATH puts /usr/bin (ninja 1.11) first; pip's ninja 1.13 built the
    cache; the two disagree on the build log, so each switch rebuilt every op."""
    from dsenv.workloads.training import runtime

    venv_bin, system_bin = tmp_path / "venv" / "bin", tmp_path / "usr" / "bin"
    for folder in (venv_bin, system_bin):
        folder.mkdir(parents=True)
        (folder / "ninja").write_text("#!/bin/sh\n")
        (folder / "ninja").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    env = {"PATH": f"{system_bin}:{venv_bin}"}
    assert runtime.prefer_env_ninja(env) == str(venv_bin)
    assert env["PATH"] == f"{venv_bin}:{system_bin}:{venv_bin}"
    assert runtime.prefer_env_ninja(env) is None  # already first: left alone
    (venv_bin / "ninja").unlink()
    env = {"PATH": str(system_bin)}
    assert runtime.prefer_env_ninja(env) is None and env["PATH"] == str(system_bin)


# ----------------------------------------------------------------------------- shared by all
def test_sanity_ceilings_for_metrics_that_must_stay_low():
    falling = [6.0] * 10 + [1.0] * 30
    limits = {"min_loss_drop": 0.5, "max_perplexity": 20.0}
    ok = report.sanity_verdict(falling, {"perplexity": 2.8}, limits)
    assert ok.status == "PASS" and "perplexity 2.8 <= 20" in ok.detail
    high = report.sanity_verdict(falling, {"perplexity": 531.7}, limits)
    assert high.status == "FAIL" and "perplexity 532 > 20" in high.detail
    missing = report.sanity_verdict(falling, {}, limits)
    assert missing.status == "FAIL"


def test_thresholds_are_the_named_settings_only():
    from dsenv.workloads import bert_squad, runner, t5_xsum

    limits = runner.thresholds(t5_xsum.SMOKE, t5_xsum.THRESHOLDS)
    assert limits == {"min_loss_drop": 0.5, "min_rouge1": 70.0, "min_rouge2": 50.0,
                      "min_rougeL": 70.0}  # not max_source_length / max_target_length
    assert set(runner.thresholds(bert_squad.SMOKE, bert_squad.THRESHOLDS)) == {
        "min_loss_drop", "min_exact_match", "min_f1"}


def test_full_run_steps_from_epochs_ranks_and_caps():
    from dsenv.workloads import runner, t5_xsum

    s = t5_xsum.FULL  # 1 epoch, 2 % warm-up
    assert runner.planned_steps(s, 10_000, 32, 1, 4) == (78, 2)  # 10000 // 4 // 32
    assert runner.planned_steps(s, 10_000, 32, 1, 4, per_rank_data=True) == (312, 6)
    assert runner.planned_steps(s, 10_000, 32, 1, 4, max_steps=10) == (10, 1)
    with pytest.raises(WorkloadError, match="100 documents are too few for one step of "
                                            "micro-batch 32 x grad-accum 1 x world size 4"):
        runner.planned_steps(s, 100, 32, 1, 4, what="documents")


def test_no_gradient_sync_needs_stage_0_and_drops_clipping():
    planned = build(preset="fp32")
    unsynced = dsconfig.without_gradient_sync(planned)
    assert unsynced.config["gradient_clipping"] == 0.0 and planned.config["gradient_clipping"]
    with pytest.raises(WorkloadError, match="needs a preset without ZeRO .* not zero2 "
                                            r"\(ZeRO stage 2\)"):
        dsconfig.without_gradient_sync(build(preset="zero2"))
    assert [dsconfig.zero_stage(p) for p in ("fp32", "bf16", "zero1", "zero3-offload")] == \
        [0, 0, 1, 3]


def test_independent_micro_batches_cover_all_data_in_each_ranks_order():
    import torch

    from dsenv.workloads.launch.env import RankInfo
    from dsenv.workloads.training import engine, runtime

    data = {"x": torch.arange(64)}

    def first_epoch(rank: int, independent: bool) -> list[int]:
        rt = runtime.Runtime(RankInfo("env", rank, rank, 2, 2, "127.0.0.1", 1), False, "cpu",
                             "cpu", "gloo", None)
        batches = engine.micro_batches(data, 8, rt, seed=3, independent=independent)
        per_epoch = 8 if independent else 4
        return [int(i) for _ in range(per_epoch) for i in next(batches)["x"]]

    shard0, shard1 = first_epoch(0, False), first_epoch(1, False)
    assert sorted(shard0 + shard1) == list(range(64))  # synced: disjoint halves
    own0, own1 = first_epoch(0, True), first_epoch(1, True)
    assert sorted(own0) == sorted(own1) == list(range(64))  # unsynced: all of it each
    assert own0 != own1  # ... in its own order


def test_options_of_other_workloads_are_one_line(tmp_path):
    for command, line in [
        (["smoke", "t5-xsum", "--no-sync-gradients"],
         "dsenv smoke t5-xsum: --no-sync-gradients is not an option of t5-xsum"),
        (["run", "gpt2-wikitext", "--doc-stride", "8"],
         "dsenv run gpt2-wikitext: --doc-stride is not an option of gpt2-wikitext"),
        (["smoke", "bert-mrpc", "--no-sync-gradients", "--preset", "zero3"],
         "dsenv smoke bert-mrpc: --no-sync-gradients trains one model per rank: it needs a "
         "preset without ZeRO (fp32, bf16, fp16), not zero3 (ZeRO stage 3)"),
        (["smoke", "all", "--data-dir", "x"],
         "dsenv smoke all: --data-dir belongs to one workload; run `dsenv smoke WORKLOAD "
         "--data-dir ...` instead of all"),
        (["smoke", "all", "--preset", "zero4"],
         "dsenv smoke all: unknown preset 'zero4'; choose one of fp32, fp16, bf16, zero1, "
         "zero2, zero3, zero3-offload"),
    ]:
        out = subprocess.run([sys.executable, "-m", "dsenv.workloads.cli", *command,
                              "--output-dir", str(tmp_path / "out")], capture_output=True,
                             text=True, timeout=60)
        assert (out.returncode, out.stderr.strip()) == (2, line)
    assert not (tmp_path / "out").exists()


def test_a_data_dir_that_is_not_a_saved_data_set_is_one_line(tmp_path):
    from dsenv.workloads import runner, synthetic

    with pytest.raises(WorkloadError, match=f"data set {tmp_path}: no dataset_dict.json in "
                                            "it; pass a folder written by datasets' "
                                            r"save_to_disk \(DatasetDict\)"):
        runner.load_saved(tmp_path, ("text",), ("train",))
    synthetic.save_splits(tmp_path / "mrpc", "mrpc", {"train": synthetic.mrpc_rows(4, 1)})
    with pytest.raises(WorkloadError, match="mrpc: no validation split .has train."):
        runner.load_saved(tmp_path / "mrpc", ("sentence1",), ("train", "validation"))
    with pytest.raises(WorkloadError, match="the train split has no text column"):
        runner.load_saved(tmp_path / "mrpc", ("text",), ("train",))


def test_smoke_all_gives_each_workload_its_own_port_and_the_same_options():
    import argparse

    from dsenv.workloads import smoke_all

    torchrun = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29600",
                "TORCHELASTIC_USE_AGENT_STORE": "True"}
    ports = [smoke_all.child_env(i, torchrun)["MASTER_PORT"] for i in range(4)]
    assert ports == ["29601", "29602", "29603", "29604"]
    assert "TORCHELASTIC_USE_AGENT_STORE" not in smoke_all.child_env(0, torchrun)
    mpirun = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
              "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert smoke_all.child_env(2, mpirun)["MASTER_PORT"] == "29503"  # the default 29500 + 3
    assert "MASTER_PORT" not in smoke_all.child_env(0, {})  # one process picks a free one
    args = argparse.Namespace(preset="zero2", deepspeed_config=None, micro_batch=None,
                              grad_accum=2, lr=0.0, lr_scaling="none", seed=7,
                              references="r.toml", examples=0, steps=None, verbose=False)
    assert smoke_all.child_arguments(args) == [
        "--preset", "zero2", "--grad-accum", "2", "--lr", "0.0", "--lr-scaling", "none",
        "--seed", "7", "--references", "r.toml", "--examples", "0"]


def test_a_missing_package_is_one_line_naming_it():
    from dsenv.workloads import runner

    runner.require("t5-xsum", {"json": "json"})  # present: nothing said
    with pytest.raises(WorkloadError, match=r"^t5-xsum needs rouge-score-nowhere: pip install "
                                            r"rouge-score-nowhere \(in dsenv's `train` "
                                            r"extra\)$"):
        runner.require("t5-xsum", {"rouge_score_nowhere": "rouge-score-nowhere"})


@pytest.mark.parametrize("n, world", [(10, 1), (10, 2), (3, 2), (3, 4), (7, 3)])
def test_evaluation_shares_cover_every_input_once_in_order_with_equal_batch_counts(n, world):
    from dsenv.workloads.training.engine import _share

    shares = [_share(n, rank, world) for rank in range(world)]
    assert len({len(share) for share in shares}) == 1  # ZeRO-3: the same number of forwards
    assert [i for share in shares for i in share][:n] == list(range(n))


@pytest.mark.parametrize("workload, repo", [("t5-xsum", "google-t5/t5-small"),
                                            ("gpt2-wikitext", "distilbert/distilgpt2"),
                                            ("bert-mrpc", "google-bert/bert-base-uncased")])
def test_full_run_without_fetched_assets_names_fetch_at_once(tmp_path, workload, repo):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(tmp_path / "empty"), HF_ENDPOINT="http://127.0.0.1:9")
    out = subprocess.run([sys.executable, "-m", "dsenv.workloads.cli", "run", workload,
                          "--output-dir", str(tmp_path / "out")], capture_output=True,
                         text=True, timeout=60, env=env)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"dsenv run {workload}: model {repo}@main (no snapshot in ")
    assert f"`dsenv fetch {workload}`" in lines[0]
    assert not (tmp_path / "empty").exists() and not (tmp_path / "out").exists()


def test_a_rank_ends_without_interpreter_finalization(tmp_path):
    """end_rank_process: the exit code and the flushed output stay, finalization (atexit,
    where gloo's threads can abort a finished rank) does not run."""
    marker = tmp_path / "finalized"
    script = ("import atexit, sys\n"
              "from dsenv.workloads.training import runtime\n"
              f"atexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
              "print('report written', end='')\n"
              "sys.stderr.write('last words')\n"
              "runtime.end_rank_process(3)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "report written", "last words")
    assert not marker.exists()
    healthy = subprocess.run([sys.executable, "-c", script.replace(
        "runtime.end_rank_process(3)", "sys.exit(3)")], capture_output=True, timeout=60)
    assert healthy.returncode == 3 and marker.exists()  # the ordinary exit finalizes
