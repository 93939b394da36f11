"""`tunnel` judges what the user typed before what this machine lacks (issue 14): a named
tunnel without its token, or a --url without its scheme, is said first, cloudflared or not."""

from __future__ import annotations

import pytest
from processes import run_cli

MISSING = "/nonexistent/cloudflared"


@pytest.mark.parametrize(("args", "said"), [
    (["math", "--mode", "named", "--hostname", "app.example.com"], "named tunnel needs its token"),
    (["math", "--mode", "named", "--token", "t0k3n"], "needs the public hostname"),
    (["--url", "127.0.0.1:8001"], "'127.0.0.1:8001' has no scheme"),
    (["math", "--mode", "sideways"], "is not quick or named"),
])
def test_settings_are_checked_before_cloudflared_is_looked_for(tmp_path, args, said):
    result = run_cli(tmp_path, "tunnel", *args, CLOUDFLARED_PATH=MISSING, timeout=60)
    assert result.returncode == 2, result.stderr
    assert said in result.stderr and "cloudflared" not in result.stderr.split("hint:")[0]


def test_a_missing_cloudflared_is_still_found_before_anything_is_served(tmp_path):
    result = run_cli(tmp_path, "tunnel", "math", "--no-auth", CLOUDFLARED_PATH=MISSING,
                     timeout=60)
    assert result.returncode != 0
    assert f"CLOUDFLARED_PATH={MISSING} does not exist" in result.stderr
    assert "serving" not in result.stderr and "opening a" not in result.stderr
