"""core/nodeproof.py: a request is proven by the node's key, once; an answer is proven by it too."""

from __future__ import annotations

import pytest

from podhealth import nodeproof
from podhealth.nodeproof import NonceCache

KEY = "k" * 64
NOW = 1_800_000_000.0


def _req(**over: object) -> dict[str, str]:
    s = nodeproof.sign(KEY, "dgx01", "POST", "/v1/gpu-reset", b'{"gpu": 3}', NOW)
    h = dict(s.headers)
    h.update({k: str(v) for k, v in over.items()})
    return h


def test_a_signed_request_is_accepted() -> None:
    assert nodeproof.request_problem(KEY, "dgx01", "POST", "/v1/gpu-reset", _req(), b'{"gpu": 3}', NOW + 5) is None


@pytest.mark.parametrize("change", ["key", "node", "method", "path", "body", "old", "future", "nonce", "unsigned"])
def test_every_part_of_a_request_is_covered(change: str) -> None:
    key, node, method, path, body, now = KEY, "dgx01", "POST", "/v1/gpu-reset", b'{"gpu": 3}', NOW
    h = _req()
    if change == "key":
        key = "j" * 64
    elif change == "node":
        node = "dgx02"
    elif change == "method":
        method = "PUT"
    elif change == "path":
        path = "/v1/bundle"
    elif change == "body":
        body = b'{"gpu": 4}'
    elif change == "old":
        now = NOW + nodeproof.WINDOW_S + 1
    elif change == "future":
        now = NOW - nodeproof.WINDOW_S - 1
    elif change == "nonce":
        h[nodeproof.H_NONCE] = "0" * 32
    else:
        del h[nodeproof.H_SIGNATURE]
    assert nodeproof.request_problem(key, node, method, path, h, body, now) is not None


def test_an_agent_without_a_key_accepts_nothing() -> None:
    assert "no key" in (nodeproof.request_problem("", "dgx01", "POST", "/v1/gpu-reset", _req(), b'{"gpu": 3}', NOW) or "")


def test_a_replay_is_refused_and_the_cache_stays_bounded() -> None:
    c = NonceCache(capacity=3, window=60)
    assert c.fresh("a" * 32, NOW, NOW)
    assert not c.fresh("a" * 32, NOW, NOW + 1)  # the same request again
    assert c.fresh("b" * 32, NOW, NOW) and c.fresh("c" * 32, NOW, NOW)
    assert not c.fresh("d" * 32, NOW, NOW + 2)  # full of live nonces: refused, none forgotten
    assert not c.fresh("a" * 32, NOW, NOW + 3)
    assert len(c) == 3
    # After 2 windows a nonce's request is out of its window anyway: it may be forgotten.
    assert c.fresh("d" * 32, NOW + 121, NOW + 121) and len(c) == 1


def test_an_answer_is_proven_only_by_the_key_for_that_nonce() -> None:
    body = b'{"status": "OK"}'
    h = nodeproof.prove(KEY, "dgx01", "GET", "/health", "n" * 32, 200, body, NOW)
    assert nodeproof.answer_problem(KEY, "dgx01", "GET", "/health", "n" * 32, 200, h, body) is None
    lower = {k.lower(): v for k, v in h.items()}  # as httpclient.Reply holds headers
    assert nodeproof.answer_problem(KEY, "dgx01", "GET", "/health", "n" * 32, 200, lower, body) is None
    for bad in [("j" * 64, "dgx01", "GET", "/health", "n" * 32, 200, body),
                (KEY, "dgx02", "GET", "/health", "n" * 32, 200, body),
                (KEY, "dgx01", "POST", "/v1/handover", "n" * 32, 200, body),
                (KEY, "dgx01", "GET", "/health", "m" * 32, 200, body),  # an old answer to another nonce
                (KEY, "dgx01", "GET", "/health", "n" * 32, 503, body),
                (KEY, "dgx01", "GET", "/health", "n" * 32, 200, b'{"status": "FAIL"}'),
                ("", "dgx01", "GET", "/health", "n" * 32, 200, body)]:
        k, node, method, path, nonce, status, b = bad
        assert nodeproof.answer_problem(k, node, method, path, nonce, status, h, b) is not None
    assert nodeproof.answer_problem(KEY, "dgx01", "GET", "/health", "n" * 32, 200, {}, body) is not None


def test_a_stream_is_proven_by_its_last_line() -> None:
    lines = b'{"type": "progress"}\n{"type": "report", "report": {}}\n'
    proof = nodeproof.proof_line(KEY, "dgx01", "POST", "/v1/handover", "n" * 32, 200, lines, NOW)
    assert nodeproof.stream_problem(KEY, "dgx01", "POST", "/v1/handover", "n" * 32, 200, lines + proof) is None
    changed = lines.replace(b"progress", b"progresz")
    assert nodeproof.stream_problem(KEY, "dgx01", "POST", "/v1/handover", "n" * 32, 200, changed + proof)
    assert nodeproof.stream_problem(KEY, "dgx01", "POST", "/v1/handover", "n" * 32, 200, lines)
    assert nodeproof.stream_problem(KEY, "dgx01", "POST", "/v1/handover", "m" * 32, 200, lines + proof)
