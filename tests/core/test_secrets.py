from m3ctl.core.secrets import MASK, is_secret_name, redact_env, redact_text


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


def test_split_api_key_takes_every_spelling_out_of_raw_args():
    import pytest

    from m3ctl.core.secrets import split_api_key
    from m3ctl.errors import BadInput

    assert split_api_key(["--max-num-seqs", "8", "--api-key", "k1", "--enforce-eager"]) == (
        ["--max-num-seqs", "8", "--enforce-eager"],
        "k1",
    )
    assert split_api_key(["--api-key=k2"]) == ([], "k2") and split_api_key(["--api_key", "k3"]) == ([], "k3")
    with pytest.raises(BadInput, match="2 keys"):
        split_api_key(["--api-key", "a", "b"])
    with pytest.raises(BadInput, match="no value"):
        split_api_key(["--api-key", "--enforce-eager"])


def test_serve_api_key_env_names_the_variable_never_the_value(monkeypatch):
    import json

    from m3ctl.core.state import Registry
    from m3ctl.planning.plan import LaunchPlan
    from m3ctl.serving.serve import api_key_for
    from tests.conftest import run_cli

    d = run_cli(
        "serve",
        "--model",
        "org/m",
        "--dry-run",
        "--json",
        "--skip-checks",
        "--api-key-env",
        "MY_KEY",
        env={"MY_KEY": "s3cr3t-value-42"},
        check=True,
    ).stdout
    assert "s3cr3t-value-42" not in d
    p = LaunchPlan.model_validate(json.loads(d))
    assert p.api_key_env == "MY_KEY" and "VLLM_API_KEY" in p.secret_env_names and "--api-key" not in p.argv
    r = run_cli("serve", "--model", "org/m", "--dry-run", "--api-key-env", "UNSET_KEY_VAR")
    assert r.returncode == 2 and "UNSET_KEY_VAR" in r.stderr and "not set" in r.stderr
    reg = Registry()
    reg.save_plan("k", p.model_dump_json())
    monkeypatch.setenv("MY_KEY", "from-the-named-variable")
    assert api_key_for(reg, "k") == "from-the-named-variable"  # what watch and bench --deployment send


def test_redact_text_masks_credentials_in_url_queries():
    """Seen by a new user: `bench --url "http://h:9/?api_key=sk-secret"` printed the key in its error line."""
    r = redact_text("cannot reach http://127.0.0.1:9/v1?api_key=sk-secret&x=1 or https://h/?Token=abc#f")
    assert "sk-secret" not in r and "abc" not in r
    assert "?api_key=***&x=1" in r and "?Token=***#f" in r
    assert redact_text("http://h/?model=m&keyword=k") == "http://h/?model=m&keyword=k"  # not a credential


def test_api_key_env_given_a_key_instead_of_a_name_never_echoes_it():
    from tests.conftest import run_cli

    p = run_cli("serve", "--model", "org/m", "--skip-checks", "--dry-run", "--api-key-env", "sk-secret")
    assert p.returncode == 2 and "sk-secret" not in p.stdout + p.stderr
    assert "takes the name of an environment variable" in p.stderr and "Traceback" not in p.stderr


def test_a_typo_of_a_secret_flag_is_refused_and_its_value_never_shown(capsys):
    """Under --skip-checks an unknown flag reaches vLLM as given: `--api-keyy sk-...` would have put the key in
    the server's argv and in the printed plan (a new-user probe found it). It is refused, even under
    --skip-checks, without echoing the value; known flags and switches pass as before."""
    import pytest

    from m3ctl.cli import main
    from m3ctl.core.secrets import near_secret_flag, redact_raw, separate
    from m3ctl.errors import BadInput

    assert near_secret_flag("--api-keyy") and near_secret_flag("hf_tokn") and near_secret_flag("--api-key")
    assert near_secret_flag("--API-KEY") and near_secret_flag("HF-Token")  # vLLM's flags are case-sensitive
    assert not near_secret_flag("--max-num-seqs") and not near_secret_flag("--api-server-count")
    with pytest.raises(BadInput) as e:
        separate({"api-keyy": "sk-TYPO123"})
    assert "sk-TYPO123" not in str(e.value) + e.value.hint
    assert separate({"enforce-eager": True}).args == {"enforce-eager": True}
    assert redact_raw(["--api-keyy", "sk-TYPO123", "--max-num-seqs", "8"]) == [
        "--api-keyy",
        "***",
        "--max-num-seqs",
        "8",
    ]
    for skip in ([], ["--skip-checks"]):
        for typo in (
            ["--", "--api-keyy", "sk-TYPO123"],
            ["--arg", "API-KEY=sk-TYPO123"],
            ["--", "--Api-Key=sk-TYPO123"],
        ):
            assert main(["plan", "--system", "h200x8", *skip, *typo]) == 2
            cap = capsys.readouterr()
            assert "sk-TYPO123" not in cap.out + cap.err and "looks like a secret one" in cap.err
