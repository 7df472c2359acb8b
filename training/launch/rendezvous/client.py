"""A small etcd v3 client over etcd's JSON gateway (HTTPS), made for membership that must outlive any member.

What the rendezvous needs and nothing more: ranges, puts under a lease, compare-and-set transactions, leases
with keep-alives, and one watch on a prefix. It speaks the v3 API as JSON over HTTPS (``POST /v3/kv/range``,
``/v3/kv/txn``, ``/v3/lease/grant``, ``/v3/watch`` as a stream of JSON lines), which every etcd >= 3.4 serves
on its client port, so the agents need no generated code. The transport is urllib3 (one pool of TLS
connections per member, kept open): a call costs the agent ~0.3 ms of CPU, half of what the same call cost
through ``requests`` (which adds cookie, hook and environment handling to every call). The exception is the
call every agent makes all the time, the lease keep-alive: it goes over etcd's own gRPC keep-alive stream to
the leader (:mod:`.lease_stream`: a third of the members' CPU per renewal that the gateway costs).

Why not a client library: ``etcd3gw`` (maintained, the same gateway) talks to one endpoint per client, has no
way to log in as an etcd user, and its watch stream ends silently when a member goes, which is the one event
this client exists to survive. ``python-etcd3`` (gRPC) is unmaintained and does not import with current
protobuf. torch's own etcd backend needs the v2 API, gone from etcd 3.6.

Failover: every call tries the endpoint that answered last, then the others; a call that finds no member
raises :class:`StoreUnavailable` after one pass (the caller decides how long to keep trying); after a pass in
which every member timed out, the next waits longer (:data:`PATIENCE_MAX`). Authentication:
a client certificate for TLS (the members require one signed by their CA) and an etcd user's password for
the token every request carries. The members' tokens (JWTs) expire after 10 minutes; the client logs in again
in the background at a random point of the token's last quarter, so that neither a call nor a job's agents,
started together, all log in at once when the tokens expire (a re-formation would otherwise wait for N logins);
a token a member calls expired all the same is fetched again on the spot.

    client = EtcdClient(ClientCredentials.from_env())
    lease = client.grant(ttl_s=3)
    client.put(client.key("members/a"), "{...}", lease=lease)
    ok, rev = client.compare_and_set(key, expected_mod_revision, new_value)
"""

from __future__ import annotations

import base64
import random
import json
import os
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

#: Seconds to connect to one member before the next is tried (members answer in milliseconds; a keep-alive that
#: waited longer on a black-holed member would risk its own lease), and to wait for its answer once connected (a
#: loaded member that answers late still renewed the lease: only a member that does not answer at all is left).
REQUEST_TIMEOUT_S = (1.0, 2.0)


#: How much longer than its timeouts a call waits after a pass in which no member answered in time (each such
#: pass doubles it, up to this; any answer sets it back to 1). One member silent past its timeout is taken for
#: gone and the next one tried at once; all of them slow is a loaded store, where giving up early only comes
#: back sooner with a new connection: its TLS handshake is more work for the members, and with a full accept
#: queue each new connect waits a dropped SYN's second (the 1,024-agent simulation's reconnect storm).
PATIENCE_MAX = 4.0


#: What a member says when it took a call but could not do it in time (its raft or its gateway's call to itself
#: timed out; 2026-11-28, 1,024 simulated agents: ``HTTP 500 context deadline exceeded`` on a lease grant, which
#: ended that agent): a loaded store, tried again like a timeout, not a refusal. A write retried after one may
#: have been done: every write here is a put (the same again), a lease grant (an extra lease expires unused) or a
#: compare-and-set (the second finds its own write and reports a lost race; its callers read again).
TOO_SLOW = ("deadline exceeded", "request timed out", "too many requests")


#: Seconds a watch stream may stay silent before the client takes its member for gone (a member whose host
#: vanished sends no reset) and watches again from another.
WATCH_IDLE_S = 15.0
# How often every member sends an idle watch a progress notice (cluster_facts.versions.WATCH_PROGRESS_S, set on
# the local, EKS and ParallelCluster members alike): well inside WATCH_IDLE_S, so a healthy idle watch is never
# torn down and re-read (etcd's default, 10 minutes, made every agent's two watches re-read their keys every
# 15 s: at 1,024 agents ~140 reads and new watches a second for nothing).


#: Where in a token's life the client logs in again ahead of its expiry: at a random point between these
#: fractions of it (spread so that agents that logged in together do not log in again together).
TOKEN_REFRESH_AT = (0.70, 0.90)
#: Seconds before a background login that failed (no member answered) is tried again.
TOKEN_RETRY_S = 10.0


def token_lifetime_s(token: str, now: float | None = None) -> float | None:
    """Seconds until an etcd JWT ``token`` expires (its ``exp`` claim, read without checking the signature: the
    members check it), or None for a token that is not a JWT (etcd's "simple" tokens live while they are used)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        return float(claims["exp"]) - (time.time() if now is None else now)
    except (ValueError, KeyError, TypeError):
        return None


class StoreUnavailable(RuntimeError):
    """No etcd member answered (all down, or unreachable). ``causes``: what each endpoint tried did, as
    ``(url, error)`` with the exception urllib3 raised or a member's answer as text: an agent that never reached
    the store tells a wrong setting from an outage by them (:mod:`.start`)."""

    def __init__(self, message: str, causes: list[tuple[str, BaseException | str]] | None = None):
        super().__init__(message)
        self.causes = list(causes or [])


class _CannotServe(Exception):
    """A member answered a login but could not serve it now (no leader, a leader election under way, too slow):
    another member may; an agent starting while the leader is replaced once took this for wrong credentials."""


def _cannot_serve(r) -> bool:
    text = _text(r)
    return r.status == 503 or "leader" in text or any(words in text for words in TOO_SLOW)


class StoreRefused(RuntimeError):
    """A member answered and refused: bad credentials, no permission for the key, or a malformed request."""


@dataclass(frozen=True)
class ClientCredentials:
    """What a client needs to reach the cluster as one etcd user (all paths readable by the agent only).

    Attributes:
        endpoints: the members' client URLs (``https://host:port``).
        ca: the CA certificate the members' certificates are signed by.
        cert: this client's certificate (TLS; any certificate the CA signed).
        key: its private key.
        user: the etcd user (a job's: ``job-<id>``).
        password_file: a file holding the user's password.
        prefix: the key prefix the user's role may read and write; every key this client makes starts with it.
    """

    endpoints: tuple[str, ...]
    ca: str
    cert: str
    key: str
    user: str
    password_file: str
    prefix: str

    ENV = {
        "endpoints": "T5_ETCD_ENDPOINTS",
        "ca": "T5_ETCD_CA",
        "cert": "T5_ETCD_CERT",
        "key": "T5_ETCD_KEY",
        "user": "T5_ETCD_USER",
        "password_file": "T5_ETCD_PASSWORD_FILE",
        "prefix": "T5_ETCD_PREFIX",
    }

    def as_env(self) -> dict[str, str]:
        """Environment variables that :meth:`from_env` reads back (what agents on other hosts are given)."""
        return {
            var: ",".join(self.endpoints) if name == "endpoints" else getattr(self, name)
            for name, var in self.ENV.items()
        }

    @classmethod
    def from_env(cls, env=None) -> "ClientCredentials":
        """From ``T5_ETCD_*`` variables; a missing one is a ValueError naming it."""
        env = os.environ if env is None else env
        missing = [var for var in cls.ENV.values() if not env.get(var)]
        if missing:
            raise ValueError(
                f"etcd credentials incomplete: {', '.join(missing)} not set (the launcher sets them; "
                f"on a cluster, the job's setup step: the job.env that admin add-job writes)"
            )
        values = {name: env[var] for name, var in cls.ENV.items()}
        values["endpoints"] = tuple(e.strip() for e in values["endpoints"].split(",") if e.strip())
        plain = [e for e in values["endpoints"] if not e.startswith("https://")]
        if plain:  # urllib3 would speak plain HTTP to a TLS port: the members hang up, an outage to the client
            raise ValueError(
                f"T5_ETCD_ENDPOINTS={env['T5_ETCD_ENDPOINTS']!r}: {plain[0]!r} is not an https:// URL "
                f"(the members serve TLS only): write each endpoint as https://HOST:PORT"
            )
        return cls(**values)


def _check_files(creds: ClientCredentials) -> None:
    """ValueError naming the variable whose file is missing or unreadable (read when the first call logs in, it
    would otherwise end that call with a raw OSError)."""
    for name in ("ca", "cert", "key", "password_file"):
        path, var = getattr(creds, name), ClientCredentials.ENV[name]
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            why = "is not readable" if os.path.isfile(path) else "does not exist"
            raise ValueError(
                f"{var}={path}: the file {why}: point {var} at the job's file (the job.env that admin "
                f"add-job writes names them all)"
            )


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(data: str) -> str:
    return base64.b64decode(data).decode()


def prefix_end(prefix: str) -> str:
    """The end of the key range holding every key that starts with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: str
    mod_revision: int
    lease: int
    create_revision: int = 0
    version: int = 0  # etcd's count of the key's writes since it was created


def _kv(raw: dict) -> KeyValue:
    return KeyValue(
        unb64(raw["key"]),
        unb64(raw.get("value", "")),
        int(raw.get("mod_revision", 0)),
        int(raw.get("lease", 0)),
        int(raw.get("create_revision", 0)),
        int(raw.get("version", 0)),
    )


class EtcdClient:
    """One user's connection to an etcd cluster (thread-safe; see the module docstring)."""

    def __init__(self, creds: ClientCredentials, request_timeout_s: float | tuple[float, float] = REQUEST_TIMEOUT_S):
        import urllib3

        self.creds = creds
        self.timeout = request_timeout_s
        _check_files(creds)  # a missing file is a setup error, not a member away
        # one pool per member; no environment (proxies, CA bundles) replaces the cluster's CA; a few connections
        # per member at once: two watch streams, the closer's, the agent's own calls. One TLS context, its CA,
        # certificate and key loaded once (urllib3 given the files would read and parse them for every connection)
        tls = ssl.create_default_context(cafile=creds.ca)
        tls.load_cert_chain(creds.cert, creds.key)
        self._http = urllib3.PoolManager(num_pools=max(4, len(creds.endpoints)), maxsize=8, ssl_context=tls)
        self._endpoints = list(creds.endpoints)
        random.shuffle(self._endpoints)  # spread the clients' watches and logins over the members
        self._token = ""
        self._lock = threading.Lock()
        self._keep_alive_stream = None  # opened by the first keep_alive()
        self._refresh: threading.Timer | None = None  # the next background login (see the module docstring)
        self._patience = 1.0  # see PATIENCE_MAX
        self._closed = False

    def key(self, suffix: str) -> str:
        return self.creds.prefix + suffix

    # ------------------------------------------------------------------ transport
    def _password(self) -> str:
        with open(self.creds.password_file) as f:
            return f.read().strip()

    def _request(
        self,
        url: str,
        body: dict,
        timeout_s: float | tuple[float, float],
        headers: dict | None = None,
        stream: bool = False,
    ):
        import urllib3

        connect, read = timeout_s if isinstance(timeout_s, tuple) else (timeout_s, timeout_s)
        return self._http.request(
            "POST",
            url,
            body=json.dumps(body).encode(),
            retries=False,
            redirect=False,
            headers={"Content-Type": "application/json", **(headers or {})},
            timeout=urllib3.Timeout(connect=connect, read=read),
            preload_content=not stream,
        )

    def _authenticate(self, url: str) -> None:
        r = self._request(
            f"{url}/v3/auth/authenticate", {"name": self.creds.user, "password": self._password()}, self.timeout
        )
        if r.status != 200 and _cannot_serve(r):  # a leader election, a loaded member: another member may serve
            raise _CannotServe(_reason(r))
        if r.status != 200:
            raise StoreRefused(f"etcd user {self.creds.user!r} could not log in at {url}: {_reason(r)}")
        self._token = r.json()["token"]
        lifetime = token_lifetime_s(self._token)
        if lifetime is not None:
            self._log_in_again_in(lifetime * random.uniform(*TOKEN_REFRESH_AT))

    def _log_in_again_in(self, seconds: float) -> None:
        with self._lock:
            if self._refresh is not None:
                self._refresh.cancel()
            if self._closed:
                return
            self._refresh = threading.Timer(max(0.0, seconds), self._log_in_again)
            self._refresh.name, self._refresh.daemon = "t5f-etcd-login", True
            self._refresh.start()

    def _log_in_again(self) -> None:
        """A background login ahead of the token's expiry; the token in use stays until the new one is here."""
        from urllib3.exceptions import HTTPError

        for url in list(self._endpoints):
            try:
                return self._authenticate(url)  # schedules the next one
            except (HTTPError, StoreRefused, _CannotServe, ValueError):
                continue
        self._log_in_again_in(TOKEN_RETRY_S)  # no member answered: the token may still be good; try again soon

    def post(
        self,
        path: str,
        body: dict,
        timeout_s: float | tuple[float, float] | None = None,
        stream: bool = False,
        authenticated: bool = True,
    ):
        """POST to the first member that answers; returns the decoded JSON (or the response if ``stream``).
        ``authenticated=False``: no login (a cluster whose authentication is not on yet)."""
        from urllib3.exceptions import HTTPError, NewConnectionError, TimeoutError as CallTimedOut

        given = timeout_s or self.timeout
        connect, read = given if isinstance(given, tuple) else (given, given)
        timeout = (connect * self._patience, read if stream else read * self._patience)  # a watch's read: idle
        errors, causes, timed_out = [], [], 0
        for url in list(self._endpoints):
            try:
                for attempt in (1, 2):  # a second time after a fresh token
                    if authenticated and not self._token:
                        self._authenticate(url)
                    headers = {"Authorization": self._token} if authenticated else {}
                    r = self._request(f"{url}/v3/{path}", body, timeout, headers, stream)
                    if r.status != 200 and "auth token" in _text(r) and attempt == 1:
                        self._token = ""
                        continue
                    break
            except HTTPError as e:  # refused, reset, timed out, TLS failed: this member is not there for us
                errors.append(f"{url}: {type(e).__name__} {str(e)[-160:]}")
                causes.append((url, e))
                timed_out += isinstance(e, CallTimedOut) and not isinstance(e, NewConnectionError)  # not refused
                continue
            except _CannotServe as e:  # its login: as the same answer to a call below
                errors.append(f"{url}: {e}")
                causes.append((url, str(e)))
                timed_out += any(words in str(e) for words in TOO_SLOW)
                continue
            if r.status == 503 or (r.status != 200 and "leader" in _text(r)):
                errors.append(f"{url}: {_reason(r)}")  # a member without a leader: try another
                causes.append((url, _reason(r)))
                continue
            if r.status != 200 and any(words in _text(r) for words in TOO_SLOW):
                errors.append(f"{url}: {_reason(r)}")  # the member took the call but not in time: as a timeout
                causes.append((url, _reason(r)))
                timed_out += 1
                continue
            if r.status != 200:
                raise StoreRefused(f"etcd {path}: {_reason(r)}")
            with self._lock:  # the member that answered goes first next time
                self._patience = 1.0
                if self._endpoints[0] != url:
                    self._endpoints.remove(url)
                    self._endpoints.insert(0, url)
            return r if stream else json.loads(r.data)
        if timed_out == len(self._endpoints):  # every member slow: a loaded store, not a lost member
            with self._lock:
                self._patience = min(PATIENCE_MAX, self._patience * 2)
        raise StoreUnavailable(f"no etcd member answered ({'; '.join(errors)})", causes)

    # ------------------------------------------------------------------ keys
    def get(self, key: str) -> KeyValue | None:
        return self.get_with_revision(key)[0]

    def get_with_revision(self, key: str) -> tuple[KeyValue | None, int]:
        """The key (or None) and the store's revision at the time of the read."""
        r = self.post("kv/range", {"key": b64(key)})
        kvs = r.get("kvs", [])
        return (_kv(kvs[0]) if kvs else None), int(r["header"]["revision"])

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` and the store's revision at the time of the read."""
        r = self.post("kv/range", {"key": b64(prefix), "range_end": b64(prefix_end(prefix))})
        return [_kv(raw) for raw in r.get("kvs", [])], int(r["header"]["revision"])

    def newest_before(self, prefix: str, create_revision: int) -> KeyValue | None:
        """The key under ``prefix`` created last before ``create_revision`` (etcd's election recipe: each
        candidate watches the one created just before it), or None."""
        r = self.post(
            "kv/range",
            {
                "key": b64(prefix),
                "range_end": b64(prefix_end(prefix)),
                "limit": "1",
                "sort_order": "DESCEND",
                "sort_target": "CREATE",
                "max_create_revision": str(create_revision - 1),
            },
        )
        kvs = r.get("kvs", [])
        return _kv(kvs[0]) if kvs else None

    def put(self, key: str, value: str, lease: int = 0) -> int:
        body = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        return int(self.post("kv/put", body)["header"]["revision"])

    def delete(self, key: str) -> None:
        self.post("kv/deleterange", {"key": b64(key)})

    def compare_and_set(
        self,
        key: str,
        mod_revision: int,
        value: str,
        lease: int = 0,
        also: dict[str, str] | None = None,
        drop: tuple[str, str] | None = None,
    ) -> bool:
        """Put ``value`` at ``key`` if the key's mod revision is still ``mod_revision`` (0: the key is absent);
        ``also``: more keys put in the same transaction (same revision), without a lease; ``drop``: the keys from
        ``drop[0]`` up to (not including) ``drop[1]`` deleted in it (none of ``also``'s may be among them)."""
        put = {"key": b64(key), "value": b64(value)}
        if lease:
            put["lease"] = str(lease)
        more = [{"request_put": {"key": b64(k), "value": b64(v)}} for k, v in (also or {}).items()]
        if drop:
            more.append({"request_delete_range": {"key": b64(drop[0]), "range_end": b64(drop[1])}})
        r = self.post(
            "kv/txn",
            {
                "compare": [{"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}],
                "success": [{"request_put": put}] + more,
            },
        )
        return bool(r.get("succeeded"))

    # ------------------------------------------------------------------ leases
    def grant(self, ttl_s: int) -> int:
        return int(self.post("lease/grant", {"TTL": str(ttl_s)})["ID"])

    def keep_alive(self, lease: int) -> int:
        """Renew ``lease`` once; returns its TTL (0: the lease is gone, e.g. it expired). Over etcd's gRPC
        keep-alive stream to the leader (:mod:`.lease_stream`: a fraction of the gateway's cost, and every agent
        renews all the time); :class:`StoreUnavailable` when no member answers."""
        from training.launch.rendezvous.lease_stream import KeepAliveFailed, LeaseKeepAliveStream

        with self._lock:
            if self._keep_alive_stream is None:
                self._keep_alive_stream = LeaseKeepAliveStream(
                    self.creds.endpoints,
                    self.creds.ca,
                    self.creds.cert,
                    self.creds.key,
                    find_leader=self.leader_endpoint,
                    token=lambda: self._token,
                )
            stream = self._keep_alive_stream  # close() may clear the attribute meanwhile
        connect, read = self.timeout if isinstance(self.timeout, tuple) else (self.timeout, self.timeout)
        try:
            return stream.renew(lease, connect, read)
        except KeepAliveFailed as e:
            raise StoreUnavailable(f"no etcd member answered the keep-alive ({e})") from None

    def leader_endpoint(self, timeout_s: float = 0.5) -> str | None:
        """The endpoint of the member that leads now (each member's ``maintenance/status`` says whether it
        does; no login needed), or None if none says so within ``timeout_s`` in all."""
        from urllib3.exceptions import HTTPError

        deadline = time.monotonic() + timeout_s
        for url in list(self._endpoints):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                r = self._request(f"{url}/v3/maintenance/status", {}, left)
                status = json.loads(r.data) if r.status == 200 else {}
            except (HTTPError, ValueError):
                continue
            if status.get("leader") and status.get("leader") == status.get("header", {}).get("member_id"):
                return url
        return None

    def close(self) -> None:
        """Close the keep-alive stream and stop the background logins (the other calls hold no open stream
        between calls)."""
        with self._lock:
            stream, self._keep_alive_stream = self._keep_alive_stream, None
            self._closed = True
            if self._refresh is not None:
                self._refresh.cancel()
        if stream is not None:
            stream.close()

    def revoke(self, lease: int) -> None:
        self.post("lease/revoke", {"ID": str(lease)})

    # ------------------------------------------------------------------ watch
    def watch(
        self,
        prefix: str,
        start_revision: int,
        on_event: Callable[[str, KeyValue], None],
        stop: threading.Event,
        single_key: bool = False,
        on_open: Callable[[object], None] | None = None,
    ) -> int:
        """Deliver every change under ``prefix`` (or of the one key ``prefix``, ``single_key``) from
        ``start_revision`` on (``on_event("PUT"|"DELETE", kv)``) until the stream breaks or ``stop`` is set;
        returns the next revision to watch from. ``on_open(response)``: the stream as soon as it is open, for a
        stopper to shut (:func:`shut_stream`: a read blocked on an idle stream wakes only then)."""
        request = {"key": b64(prefix), "start_revision": str(start_revision), "progress_notify": True}
        if not single_key:
            request["range_end"] = b64(prefix_end(prefix))
        body = {"create_request": request}
        connect = self.timeout[0] if isinstance(self.timeout, tuple) else self.timeout
        response = self.post("watch", body, timeout_s=(connect, WATCH_IDLE_S), stream=True)
        next_rev = start_revision
        try:
            if on_open is not None:
                on_open(response)
            for line in _lines(response):
                if stop.is_set():
                    break
                result = json.loads(line).get("result", {})
                if result.get("canceled"):
                    raise StoreRefused(f"etcd watch canceled: {result.get('cancel_reason', '?')}")
                for event in result.get("events", []):
                    kv = _kv(event["kv"])
                    on_event(event.get("type", "PUT"), kv)
                    next_rev = max(next_rev, kv.mod_revision + 1)
                header_rev = int(result.get("header", {}).get("revision", 0))
                if header_rev and not result.get("events"):
                    next_rev = max(next_rev, header_rev + 1)  # a progress notice: nothing before it is missed
        finally:
            response.close()
        return next_rev


def shut_stream(response) -> None:
    """Wake a thread blocked reading ``response`` (a watch stream) now: its socket shut for reading (urllib3's
    ``shutdown``; closing the response from another thread does not wake the read)."""
    try:
        response.shutdown()
    except (ValueError, RuntimeError, OSError):  # already released or closed: no read to wake
        pass


def _lines(response) -> Iterator[str]:
    """The non-empty lines of a streamed response, each as soon as it is complete."""
    pending = b""
    for chunk in response.stream(None):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield line.decode()
    if pending.strip():
        yield pending.decode()


def _text(r) -> str:
    """A (non-streamed) response's body as text."""
    return (r.data or b"").decode(errors="replace")


def _reason(r) -> str:
    try:
        answer = json.loads(r.data)
        return f"HTTP {r.status} {answer.get('message') or answer.get('error') or _text(r)[:200]}"
    except (ValueError, AttributeError):
        return f"HTTP {r.status} {_text(r)[:200]}"
