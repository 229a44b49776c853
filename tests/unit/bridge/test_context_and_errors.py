import pytest

from backends import errors as be
from bridge.reconcilers.backend_clients import BackendCache
from bridge.reconcilers.errors import claim_error_from, pool_error_from
from bridge.runtime.waits import HoldOff


class FakeBackend:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def test_backend_cache_reuses_until_fingerprint_changes():
    cache = BackendCache()
    built = []

    def build():
        built.append(FakeBackend())
        return built[-1]

    first = cache.get(("ns", "K", "p"), "f1", build)
    assert cache.get(("ns", "K", "p"), "f1", build) is first
    assert len(built) == 1
    second = cache.get(("ns", "K", "p"), "f2", build)
    assert second is not first and first.closed and not second.closed
    cache.drop(("ns", "K", "p"))
    assert second.closed
    third = cache.get(("ns", "K", "q"), "f", build)
    cache.close()
    assert third.closed


def test_backend_cache_does_not_cache_failures():
    cache = BackendCache()

    def fail():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        cache.get(("a", "b", "c"), "f", fail)
    assert isinstance(cache.get(("a", "b", "c"), "f", FakeBackend), FakeBackend)


def test_exhaustion_gate_holds_then_reopens():
    now = [100.0]
    exhausted = HoldOff(5.0, clock=lambda: now[0])
    key = ("ns", "K", "p")
    assert not exhausted.held(key)
    exhausted.hold(key)
    assert exhausted.held(key)
    now[0] += 4.9
    assert exhausted.held(key)
    now[0] += 0.2
    assert not exhausted.held(key) and len(exhausted) == 0  # ran out: forgotten
    exhausted.hold(key)
    exhausted.lift(key)  # an address freed, or the pool gone
    assert not exhausted.held(key) and len(exhausted) == 0


@pytest.mark.parametrize(
    ("exc", "reason", "person"),
    [
        (be.AuthenticationFailedError("bad"), "AuthenticationFailed", True),
        (be.SubnetNotFoundError("nope"), "SubnetNotFound", True),
        (be.InvalidRequestError("ssl"), "InvalidSpec", True),
        (be.BackendUnavailableError("down"), "BackendUnavailable", False),
        (be.ConflictError("race"), "BackendUnavailable", False),
    ],
)
def test_pool_error_mapping(exc, reason, person):
    error = pool_error_from(exc, "PHPIPAMIPPool ns/p")
    assert (error.reason, error.needs_person) == (reason, person)
    assert error.message.startswith("PHPIPAMIPPool ns/p: ")


@pytest.mark.parametrize(
    ("exc", "reason", "delay"),
    [
        (be.SubnetExhaustedError("full"), "PoolExhausted", 5),
        (be.AuthenticationFailedError("bad"), "PoolNotReady", 60),
        (be.SubnetNotFoundError("nope"), "PoolNotReady", 60),
        (be.InvalidRequestError("bad"), "PoolNotReady", 60),
        (be.BackendUnavailableError("down"), "AllocationFailed", 10),
        (be.ConflictError("race"), "AllocationFailed", 10),
    ],
)
def test_claim_error_mapping(exc, reason, delay):
    error = claim_error_from(
        exc, "pool", retry_seconds=10, config_error_seconds=60, exhausted_seconds=5
    )
    assert (error.reason, error.delay) == (reason, delay)


def _wrapped_tls_error(inner: BaseException) -> be.BackendError:
    """A backend error as the clients raise it: requests -> urllib3 -> ssl, chained."""
    import requests
    import urllib3

    try:
        try:
            try:
                raise inner
            except BaseException as ssl_exc:
                url = "/api/capi/user/"
                raise urllib3.exceptions.MaxRetryError(None, url, ssl_exc) from ssl_exc
        except urllib3.exceptions.MaxRetryError as retry_exc:
            raise requests.exceptions.SSLError(retry_exc) from None
    except requests.RequestException as exc:
        error = be.BackendUnavailableError("phpIPAM POST user/: cannot reach https://ipam/api")
        error.__cause__ = exc
        return error


def test_tls_failure_finds_the_verification_message_in_the_chain():
    import ssl

    inner = ssl.SSLCertVerificationError(1, "certificate verify failed")
    inner.verify_message = "self-signed certificate in certificate chain"
    exc = _wrapped_tls_error(inner)
    assert be.tls_failure(exc) == (
        "certificate verify failed: self-signed certificate in certificate chain"
    )


def test_tls_verification_failure_is_named_and_needs_a_person():
    exc = be.TLSVerificationError(
        "phpIPAM GET subnets/7/: TLS verification of "
        "https://ipam/api failed (certificate verify failed: x)"
    )
    assert not exc.retryable
    pool = pool_error_from(exc, "PHPIPAMIPPool ns/p")
    assert pool.reason == "TLSVerificationFailed" and pool.needs_person
    assert "certificate verify failed: x" in pool.message
    assert "spec.tls.caSecretRef" in pool.message
    claim = claim_error_from(
        exc, "pool", retry_seconds=10, config_error_seconds=60, exhausted_seconds=5
    )
    assert (claim.reason, claim.delay) == ("PoolNotReady", 60)
    assert "TLS verification" in claim.message


def test_plain_connection_errors_are_not_tls_failures():
    import requests

    exc = be.BackendUnavailableError("down")
    exc.__cause__ = requests.ConnectionError("refused")
    assert be.tls_failure(exc) is None
    assert pool_error_from(exc, "p").needs_person is False
