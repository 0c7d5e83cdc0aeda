from kvscope.engines.base import REDACTED, Launch


def test_secrets_are_redacted_everywhere() -> None:
    launch = Launch(
        ("serve", "--api-key", "sk-123", "--hf-token=hf_abc", "--enable-prompt-tokens-details",
         "--port", "8000"),
        (("HF_TOKEN", "hf_abc"), ("OPENAI_API_KEY", "sk-123"), ("HF_HUB_OFFLINE", "1")),
    )  # fmt: skip
    shell = launch.shell()
    assert "sk-123" not in shell and "hf_abc" not in shell
    argv = launch.redacted_argv()
    assert argv[argv.index("--api-key") + 1] == REDACTED
    assert f"--hf-token={REDACTED}" in argv
    # a flag that merely contains "token" is not a secret, nor is the value after it
    assert argv[argv.index("--enable-prompt-tokens-details") + 1] == "--port"
    assert launch.redacted_env()["HF_HUB_OFFLINE"] == "1"
    assert launch.argv[2] == "sk-123"  # the real command keeps the value
