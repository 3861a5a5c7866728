from dsenv.redact import Redactor, is_secret_name, show_variable


def test_secret_names():
    for name in ("HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "hf_token"):
        assert is_secret_name(name), name
    for name in ("PATH", "NCCL_IB_HCA", "SLURM_JOB_ID"):
        assert not is_secret_name(name), name


def test_scrub_masks_values_everywhere_longest_first():
    r = Redactor({"HF_TOKEN": "hf_abcdef", "OTHER_KEY": "hf_abcdef123", "PATH": "/usr/bin"})
    text = "token hf_abcdef and key hf_abcdef123 on /usr/bin"
    assert r.scrub(text) == "token *** and key *** on /usr/bin"


def test_short_values_are_not_masked_everywhere():
    assert Redactor({"USE_KEY": "1"}).scrub("1 GPU") == "1 GPU"


def test_scrub_obj_walks_json_structures():
    r = Redactor({"HF_TOKEN": 'se"cret\\x'})
    obj = {"a": ['has se"cret\\x inside', 3], 'se"cret\\x': None}
    assert r.scrub_obj(obj) == {"a": ["has *** inside", 3], "***": None}


def test_show_variable():
    assert show_variable("HF_TOKEN", "abc") == "HF_TOKEN=***"
    assert show_variable("NCCL_DEBUG", "INFO") == "NCCL_DEBUG=INFO"
