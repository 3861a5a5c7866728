"""Efficiency in every run report, and a performance reference for every common GPU.

Model FLOPs per sample (workloads/efficiency.py) against published model sizes and the
Megatron-LM closed form; the peaks table (envs/device_peaks.toml) row by row; the
efficiency of a run recorded on a real H200; every common GPU's reference; and a real CPU
smoke, whose report says efficiency "not known" and why.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from dsenv.envs import peaks
from dsenv.workloads import efficiency, report
from dsenv.workloads.training import dsconfig
from tests.harness.workload_runs import explain, run_dsenv

FIXTURE = Path(__file__).parent / "fixtures" / "runs" / "h200-2026-11-26-bert-squad-fullrun.json"
BERT_BASE = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 768,
             "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
             "max_position_embeddings": 512, "type_vocab_size": 2}
BERT_LARGE = BERT_BASE | {"hidden_size": 1024, "num_hidden_layers": 24,
                          "num_attention_heads": 16, "intermediate_size": 4096}
T5_SMALL = {"model_type": "t5", "vocab_size": 32128, "d_model": 512, "d_ff": 2048, "d_kv": 64,
            "num_heads": 8, "num_layers": 6, "feed_forward_proj": "relu"}
GPT2 = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
        "n_positions": 1024}
# torch.cuda.get_device_name() on each common GPU (the AMD ones: as ROCm names a GCD)
COMMON_GPUS = {"H100": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"],
               "H200": ["NVIDIA H200"],
               "A100": ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"],
               "V100": ["Tesla V100-SXM2-32GB", "Tesla V100-SXM2-16GB"],
               "MI250X": ["AMD Instinct MI250X", "AMD Instinct MI250X/MI250"],
               "MI100": ["AMD Instinct MI100"]}
GPU_PRESETS = ("fp32", "zero1", "zero2", "fp16", "bf16")  # what the GPU rows are keyed by


# ----------------------------------------------------------------------------- FLOPs
def test_parameter_counts_match_published_model_sizes():
    # BERT paper (arXiv:1810.04805): BERT-base 110M, BERT-large 340M parameters; the exact
    # counts are transformers' BertModel's. t5-small: 60,506,624 (Hugging Face's t5-small,
    # as LUMI's T5-XSum example tables it); GPT-2 small: 124,439,808 (117M in its paper,
    # which counted without the position table's later size).
    assert efficiency.bert_flops(BERT_BASE | {"architectures": ["BertModel"]},
                                 128).parameters == 109_482_240
    assert efficiency.bert_flops(BERT_LARGE | {"architectures": ["BertModel"]},
                                 128).parameters == 335_141_888
    assert efficiency.t5_flops(T5_SMALL, 128, 64).parameters == 60_506_624
    assert efficiency.gpt2_flops(GPT2, 1024).parameters == 124_439_808


def test_flops_per_sample_match_the_megatron_closed_form():
    # Megatron-LM (arXiv:2104.04473, sec. 5.1) per sequence of s tokens, without activation
    # recomputation (3 passes' worth instead of 4): 72 s l h^2 (1 + s / 6h). bert-base at
    # s 384: 72 x 384 x 12 x 768^2 x (1 + 384/4608) = 211.997 GFLOP; dsenv also counts biases,
    # layer norms and the span head: 212.276 GFLOP (+0.13%).
    flops = efficiency.model_flops(BERT_BASE | {"architectures": ["BertForQuestionAnswering"]},
                                   {"tokens": 384})
    assert flops.flops_per_sample == 212_276_482_560
    assert flops.flops_per_sample == pytest.approx(72 * 384 * 12 * 768**2 * (1 + 384 / 4608),
                                                   rel=2e-3)
    # the 6N rule of thumb (Kaplan et al. 2020) for the non-attention part, N = 85.06M
    assert flops.token_parameters == 85_056_002
    assert 6 * flops.token_parameters * 384 / flops.flops_per_sample == pytest.approx(0.923,
                                                                                      abs=1e-3)


def test_parameter_counts_match_the_models_transformers_builds():
    torch = pytest.importorskip("torch")
    import transformers as tf

    cases = [(tf.BertConfig(), tf.BertForQuestionAnswering, {"tokens": 384}),
             (tf.BertConfig(num_labels=3), tf.BertForSequenceClassification, {"tokens": 128}),
             (tf.GPT2Config(n_layer=6), tf.GPT2LMHeadModel, {"tokens": 128}),
             (tf.T5Config(num_layers=2, feed_forward_proj="gated-gelu", tie_word_embeddings=False),
              tf.T5ForConditionalGeneration, {"encoder": 40, "decoder": 12})]
    for config, cls, lengths in cases:
        with torch.device("meta"):  # sizes only: no memory, no initialization
            model = cls(config)
        as_json = json.loads(config.to_json_string()) | {"architectures": [cls.__name__]}
        counted = efficiency.model_flops(as_json, lengths)
        assert counted.parameters == sum(p.numel() for p in model.parameters()), cls.__name__


def test_an_unknown_model_type_gives_efficiency_not_known(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    eff = efficiency.for_run(tmp_path, _Settings(), {}, "NVIDIA H200", 10.0)
    assert eff["status"] == "not known" and "no FLOPs formula for model type 'llama'" in \
        eff["reason"]
    missing = efficiency.for_run(tmp_path / "nowhere", _Settings(), {}, "NVIDIA H200", 10.0)
    assert missing["status"] == "not known" and "config.json" in missing["reason"]


class _Settings:
    max_length = 128


@pytest.mark.parametrize("ds_config, tf32, expected", [
    ({"bf16": {"enabled": True}}, False, "bf16"),
    ({"fp16": {"enabled": True}}, True, "fp16"),
    ({"torch_autocast": {"enabled": True, "dtype": "torch.bfloat16"}}, False, "bf16"),
    ({"torch_autocast": {"enabled": True, "dtype": "torch.float16"}}, False, "fp16"),
    ({"zero_optimization": {"stage": 2}}, False, "fp32"),
    ({"fp16": {"enabled": False}}, True, "tf32"),
])
def test_the_precision_a_ds_config_trains_in(ds_config, tf32, expected):
    assert efficiency.run_precision(ds_config, tf32) == expected


# ----------------------------------------------------------------------------- peaks
def test_every_peak_row_has_a_datasheet_source_and_dense_figures():
    rows = peaks.rows()
    models = {row["model"] for row in rows}
    for needed in ("NVIDIA H100 SXM5", "NVIDIA H200 SXM", "NVIDIA V100 SXM2",
                   "AMD Instinct MI250X, one GCD", "AMD Instinct MI100", "NVIDIA L40S",
                   "NVIDIA A10", "NVIDIA T4"):
        assert needed in models
    for row in rows:
        assert row["source"].startswith("https://"), row["model"]
        assert row["match"] and all(isinstance(glob, str) for glob in row["match"])
        figures = {p: row[p] for p in peaks.PRECISIONS if p in row}
        assert "fp32" in figures and all(v > 0 for v in figures.values()), row["model"]
        if "package" in row:  # per GCD: the package's figure over its GCDs
            for precision, value in figures.items():
                assert value == pytest.approx(row["package"][precision] / row["package"]["gcds"])


@pytest.mark.parametrize("device, precision, model, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", "NVIDIA H100 SXM5", 989.4),
    ("NVIDIA H100 PCIe", "bf16", "NVIDIA H100 PCIe", 756.5),
    ("NVIDIA H200", "bf16", "NVIDIA H200 SXM", 989.4),
    ("NVIDIA H200", "fp32", "NVIDIA H200 SXM", 67.0),
    ("NVIDIA A100-SXM4-80GB", "tf32", "NVIDIA A100 (SXM4 and PCIe, 40 and 80 GB)", 156.0),
    ("NVIDIA A100-PCIE-40GB", "fp16", "NVIDIA A100 (SXM4 and PCIe, 40 and 80 GB)", 312.0),
    ("NVIDIA A10", "bf16", "NVIDIA A10", 125.0),
    ("Tesla V100-SXM2-32GB", "fp16", "NVIDIA V100 SXM2", 125.0),
    ("Tesla V100-PCIE-32GB", "fp32", "NVIDIA V100 PCIe", 14.0),
    ("AMD Instinct MI250X", "bf16", "AMD Instinct MI250X, one GCD", 191.5),
    ("AMD Instinct MI250X/MI250", "fp16", "AMD Instinct MI250X, one GCD", 191.5),
    ("AMD Instinct MI100", "tf32", "AMD Instinct MI100", 46.1),  # no tf32 units: fp32
])
def test_peaks_by_torch_device_name(device, precision, model, tflops):
    peak = peaks.peak(device, precision)
    assert isinstance(peak, peaks.Peak) and (peak.model, peak.tflops) == (model, tflops)
    if "MI250X" in device:
        assert "per GCD" in peak.note and "383" in peak.note


@pytest.mark.parametrize("device, precision, reason", [
    ("cpu:AMD EPYC 7763 64-Core Processor", "fp32", "no peak for CPUs"),
    ("Tesla V100-SXM2-32GB", "bf16", "has no bf16 math units"),
    ("NVIDIA GeForce RTX 4090", "bf16", "no peak for 'NVIDIA GeForce RTX 4090'"),
])
def test_no_peak_is_a_reason_never_a_number(device, precision, reason):
    unknown = peaks.peak(device, precision)
    assert isinstance(unknown, peaks.PeakUnknown) and reason in unknown.reason
    eff = efficiency.efficiency(efficiency.model_flops(BERT_BASE, {"tokens": 128}), 100.0,
                                device, precision)
    assert eff["status"] == "not known" and eff["value"] is None and reason in eff["reason"]
    assert eff["flops_per_sample"] > 0  # the model's work is known all the same


# ----------------------------------------------------------------------------- a real GPU run
def test_efficiency_of_the_run_recorded_on_an_h200():
    recorded = json.loads(FIXTURE.read_text())
    assert recorded["recorded"].startswith("recorded on one NVIDIA H200, 2026-11-26, dsenv full "
                                           "run bert-squad bf16")
    precision = efficiency.run_precision(dsconfig.presets()[recorded["preset"]]["config"])
    flops = efficiency.model_flops(recorded["model_config"],
                                   efficiency.sequence_lengths(_Window(384)))
    eff = efficiency.efficiency(flops, recorded["training"]["samples_per_s_per_device"],
                                recorded["gpu"], precision)
    # By hand: bert-base with the span head at 384 tokens,
    #   N = 12 x (4 x (768^2 + 768) + (768 x 3072 + 3072) + (3072 x 768 + 768) + 4 x 768)
    #       + (2 x 768 + 2) = 85,056,002
    #   6 N T = 6 x 85,056,002 x 384 = 195,969,028,608; 12 L h T^2 = 12 x 12 x 768 x 384^2
    #   = 16,307,453,952; together 212,276,482,560 FLOP per sample.
    #   x 563.0657 samples/s = 119.53 TFLOP/s; / 989.4 TFLOP/s (H200 SXM, bf16 dense) = 12.08%
    #   (the 200-step run, 531.6 samples/s: 11.41%; the plain PyTorch loop, 1034.6: 22.2%)
    assert precision == "bf16" and eff["status"] == "known"
    assert eff["flops_per_sample"] == 212_276_482_560
    assert eff["model_tflops_per_device"] == pytest.approx(119.5256, rel=1e-5)
    assert eff["value"] == pytest.approx(0.120806, rel=1e-5)
    assert eff["peak"]["model"] == "NVIDIA H200 SXM" and eff["peak"]["tflops"] == 989.4
    assert efficiency.describe(eff) == ("12.1% of the NVIDIA H200 SXM bf16 peak (212 GFLOP/sample"
                                        " x 563.1/s = 120 TFLOP/s per device; peak 989.4 TFLOP/s)")
    # and the performance verdict that was "reported only" that day now has its reference
    verdict = report.performance_verdict(recorded["training"]["samples_per_s"], 1,
                                         recorded["gpu"], recorded["preset"],
                                         "bert-squad-full", report.load_references())
    assert verdict.status == "PASS" and "measured by dsenv on one NVIDIA H200" in verdict.detail
    run3 = recorded["run3_200_steps"]["training"]["samples_per_s"]
    assert report.performance_verdict(run3, 1, "NVIDIA H200", "bf16", "bert-squad-full",
                                      report.load_references()).status == "PASS"


class _Window:
    def __init__(self, max_length: int):
        self.max_length = max_length


def test_the_summary_shows_efficiency_beside_samples_per_second():
    from rich.console import Console

    recorded = json.loads(FIXTURE.read_text())
    eff = efficiency.efficiency(
        efficiency.model_flops(recorded["model_config"], {"tokens": 384}),
        recorded["training"]["samples_per_s_per_device"], "NVIDIA H200", "bf16")
    doc = {"workload": "bert-squad", "mode": "run", "status": "PASS", "wall_s": 21.6,
           "run": {"launcher": "none", "world_size": 1, "backend": "nccl",
                   "device_type": "NVIDIA H200"},
           "batch": {"preset": "bf16", "train_batch_size": 32, "micro_batch": 32,
                     "grad_accum": 1, "world_size": 1, "lr": 5e-5, "lr_scaling": "none"},
           "training": recorded["training"] | {"seconds": 3.0, "efficiency": eff},
           "metrics": {"exact_match": 98.4}, "verdicts": recorded["verdicts"]}
    console = Console(file=io.StringIO(), width=200, record=True)
    report.print_summary(console, doc)
    text = console.export_text()
    lines = text.splitlines()
    throughput = next(i for i, line in enumerate(lines) if "throughput" in line)
    assert "563.1 samples/s" in lines[throughput]
    assert "efficiency" in lines[throughput + 1]
    assert "12.1% of the NVIDIA H200 SXM bf16 peak" in lines[throughput + 1]


# ----------------------------------------------------------------------------- references
def test_every_common_gpu_has_a_reference_for_every_workload_run():
    from dsenv.workloads import bert_mrpc, bert_squad, gpt2_wikitext, t5_xsum

    refs = report.load_references()
    keys = [s.perf_key for w in (bert_squad, bert_mrpc, t5_xsum, gpt2_wikitext)
            for s in (w.SMOKE, w.FULL)]
    assert len(set(keys)) == 8
    presets = dsconfig.presets()
    checked = 0
    for gpu, names in COMMON_GPUS.items():
        for name in names:
            for preset in GPU_PRESETS:
                precision = efficiency.run_precision(presets[preset]["config"])
                if isinstance(peaks.peak(name, precision), peaks.PeakUnknown):
                    assert (gpu, precision) == ("V100", "bf16")  # Volta has no bf16
                    continue
                for key in keys:
                    ref = report.find_reference(refs, key, name, 1, preset)
                    assert ref is not None, f"{key}: no reference for {name!r}, {preset}"
                    assert ref.get("source") and ref.get("method"), (key, name, preset)
                    assert ref.get("basis") in ("measured", "published", "derived")
                    if ref["basis"] == "derived":
                        assert ref["tolerance"] >= 0.4, (key, name, preset)
                    verdict = report.performance_verdict(ref["samples_per_s"], 1, name, preset,
                                                         key, refs)
                    assert verdict.status == "PASS" and ref["source"] in verdict.detail
                    checked += 1
    assert checked == 8 * 5 * (2 + 1 + 3 + 2 + 2 + 1) - 8 * 2  # V100's bf16 left out


def test_derived_references_fail_a_run_far_below_them():
    refs = report.load_references()
    ref = report.find_reference(refs, "bert-squad-full", "NVIDIA A100-SXM4-80GB", 1, "bf16")
    assert ref["basis"] == "derived" and "110.5 seq/s" in ref["method"]
    slow = report.performance_verdict(ref["samples_per_s"] * 0.3, 1, "NVIDIA A100-SXM4-80GB",
                                      "bf16", "bert-squad-full", refs)
    assert slow.status == "FAIL" and "derived" in slow.detail
    assert "DeepLearningExamples" in slow.detail


# ----------------------------------------------------------------------------- a CPU smoke
@pytest.mark.slow
def test_a_cpu_smoke_report_says_efficiency_not_known_and_why(tmp_path, run_env, no_references):
    # 60 steps: too few to learn the task (sanity may fail), enough for a report
    result, doc = run_dsenv(tmp_path, run_env, "--references", no_references, "--steps", "60",
                            "--examples", "0", timeout=240)
    assert result.returncode in (0, 1) and doc is not None, explain(result)
    eff = doc["training"]["efficiency"]
    assert eff["status"] == "not known" and eff["value"] is None
    assert eff["reason"].startswith("no peak for CPUs") and eff["precision"] == "fp32"
    # the tiny BERT's FLOPs are known: h 64, 2 layers, FFN 128, seq 64, span head
    #   N = 2 x (4 x (64^2 + 64) + (64 x 128 + 128) + (128 x 64 + 64) + 4 x 64) + 130 = 67,074
    #   6 N T + 12 L h T^2 = 6 x 67,074 x 64 + 12 x 2 x 64 x 64^2 = 32,047,872
    assert eff["flops_per_sample"] == 32_047_872 and eff["model"]["type"] == "bert"
    assert eff["samples_per_s_per_device"] == doc["training"]["samples_per_s_per_device"]
    assert eff["model_tflops_per_device"] == pytest.approx(
        32_047_872 * eff["samples_per_s_per_device"] / 1e12)
    assert "not known: no peak for CPUs" in result.stdout
