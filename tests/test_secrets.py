from m3ctl.secrets import MASK, is_secret_name, redact_env, redact_text


def test_redact_env():
    env = {"HF_TOKEN": "hf_abcdefghijk", "VLLM_API_KEY": "k", "PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "s"}
    r = redact_env(env)
    assert r["HF_TOKEN"] == MASK and r["VLLM_API_KEY"] == MASK and r["AWS_SECRET_ACCESS_KEY"] == MASK
    assert r["PATH"] == "/bin"
    assert not is_secret_name("CUDA_VISIBLE_DEVICES")


def test_redact_text():
    t = "token hf_abcdefghijklmnop and sk-abcdefghijkl and Authorization: Bearer xyz.abc and mypass123"
    r = redact_text(t, ["mypass123"])
    for s in ("hf_abcdefghijklmnop", "sk-abcdefghijkl", "xyz.abc", "mypass123"):
        assert s not in r
