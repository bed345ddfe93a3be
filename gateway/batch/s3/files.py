"""File bodies and results in an S3-compatible bucket: PUT, GET and HEAD of whole objects over aiohttp.

The same names as the local directory (gateway/batch/files.py), under `batches.s3.prefix`. Each request is
signed with SigV4 (gateway/batch/s3/sigv4.py). A 5xx, a 429 or a broken connection is tried again with
full-jitter backoff, `max_attempts` times in all: every call is a whole-object PUT, a GET, a HEAD or a
DELETE, so a repeat changes nothing. Anything else the store refuses raises `S3StoreError`, whose
message names the call, the object, the bucket and the endpoint, and never a key or a signature.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from gateway.batch.files import FileStoreError, check_name
from gateway.batch.s3.sigv4 import EMPTY_SHA256, UNSIGNED_PAYLOAD, Credentials, encode_path, sign
from gateway.config.batches import S3Options

log = logging.getLogger("switchyard.batch.s3")

_HASH_IN_THREAD_BYTES = 256 * 1024
_BACKOFF_CAP_S = 5.0
_KEY_CODES = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken")
_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")


class S3StoreError(FileStoreError):
    """The bucket refused or failed a call (after retries); the message says which and why."""


def credentials_from_env(options: S3Options, environ: Mapping[str, str] | None = None) -> Credentials:
    """The keys from the variables `batches.s3` names (by default the standard AWS ones)."""
    env = os.environ if environ is None else environ
    if options.unset_key_variable(env) is not None:
        raise S3StoreError(
            f"batches.s3: set the environment variables {options.access_key_id_env} and "
            f"{options.secret_access_key_env}"
        )
    key_id, secret = env[options.access_key_id_env], env[options.secret_access_key_env]
    return Credentials(key_id, secret, env.get(options.session_token_env) or None)


def _host(endpoint: str) -> tuple[str, str]:
    """The scheme and the Host header of an endpoint URL (no port when it is the scheme's default)."""
    parts = urlsplit(endpoint)
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    default = 443 if parts.scheme == "https" else 80
    if parts.port is not None and parts.port != default:
        host = f"{host}:{parts.port}"
    return parts.scheme, host


class S3FileStore:
    """A `FileStore` on one bucket of an S3-compatible server (path-style URLs unless `virtual`)."""

    def __init__(self, options: S3Options, credentials: Credentials) -> None:
        self.options = options
        self._credentials = credentials
        self._scheme, host = _host(options.endpoint)
        virtual = options.addressing == "virtual"
        self._host = f"{options.bucket}.{host}" if virtual else host
        self._base = "" if virtual else f"/{options.bucket}"
        self._where = f"bucket `{options.bucket}` at {options.endpoint.rstrip('/')}"
        self._session: aiohttp.ClientSession | None = None
        self._bucket_seen = False

    def __repr__(self) -> str:
        return f"S3FileStore({self._where})"

    async def put(self, name: str, data: bytes) -> None:
        key = self._key(name)
        if not self.options.sign_payload:
            digest = UNSIGNED_PAYLOAD
        elif len(data) > _HASH_IN_THREAD_BYTES:
            digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
        else:
            digest = hashlib.sha256(data).hexdigest()
        status, body = await self._send("PUT", key, data, digest)
        if not 200 <= status < 300:
            raise self._refused("PUT", key, status, body)

    async def get(self, name: str) -> bytes | None:
        key = self._key(name)
        status, body = await self._send("GET", key)
        if status == 200:
            return body
        if status == 404 and _code(body) != "NoSuchBucket":
            await self._missing_object_or_bucket()
            return None
        raise self._refused("GET", key, status, body)

    async def exists(self, name: str) -> bool:
        key = self._key(name)
        status, body = await self._send("HEAD", key)
        if status == 200:
            return True
        if status == 404:
            await self._missing_object_or_bucket()
            return False
        raise self._refused("HEAD", key, status, await self._reason(body))

    async def delete(self, name: str) -> None:
        key = self._key(name)
        status, body = await self._send("DELETE", key)
        if not 200 <= status < 300 and not (status == 404 and _code(body) != "NoSuchBucket"):
            raise self._refused("DELETE", key, status, body)

    async def check(self) -> None:
        """Raise `S3StoreError` unless the bucket exists and the keys may use it."""
        status, body = await self._send("HEAD", None)
        if status != 200:
            raise self._refused("HEAD", None, status, await self._reason(body))

    async def _reason(self, body: bytes) -> bytes:
        # A refused HEAD has no error document: the bucket's location, asked with a GET, says why.
        if body:
            return body
        return (await self._send("GET", None, query="location="))[1]

    async def _missing_object_or_bucket(self) -> None:
        # A HEAD answer has no body to say which is missing: ask the bucket once, until it has answered.
        if not self._bucket_seen:
            await self.check()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _key(self, name: str) -> str:
        return self.options.prefix + check_name(name)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(
                total=None,
                sock_connect=self.options.connect_timeout_s,
                sock_read=self.options.read_timeout_s,
            )
            self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        return self._session

    async def _send(
        self,
        method: str,
        key: str | None,
        data: bytes | None = None,
        digest: str = EMPTY_SHA256,
        query: str = "",
    ) -> tuple[int, bytes]:
        """One call, tried again on a 5xx, a 429 or a broken connection; the status and body of the last."""
        path = f"{self._base}/{encode_path(key)}" if key is not None else (self._base or "/")
        url = URL(f"{self._scheme}://{self._host}{path}{f'?{query}' if query else ''}", encoded=True)
        attempts = self.options.max_attempts
        for attempt in range(1, attempts + 1):
            headers = sign(
                method,
                self._host,
                path,
                credentials=self._credentials,
                region=self.options.region,
                payload_sha256=digest,
                query=query,
            )
            headers["host"] = self._host
            try:
                async with self._client().request(
                    method, url, data=data, headers=headers, allow_redirects=False
                ) as response:
                    status, body = response.status, await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if status < 500 and status != 429:
                    if 200 <= status < 300:
                        self._bucket_seen = True
                    return status, body
                failure = f"HTTP {status} {_code(body)}".rstrip()
            if attempt == attempts:
                raise S3StoreError(f"S3 {method} {self._what(key)} failed {attempts} times, last: {failure}")
            delay = random.uniform(0, min(_BACKOFF_CAP_S, self.options.retry_backoff_s * 2 ** (attempt - 1)))
            log.warning("S3 %s %s: %s; trying again in %.2f s", method, self._what(key), failure, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _what(self, key: str | None) -> str:
        return f"`{key}` in {self._where}" if key is not None else self._where

    def _refused(self, method: str, key: str | None, status: int, body: bytes) -> S3StoreError:
        code = _code(body)
        if status == 404 and (key is None or code == "NoSuchBucket"):
            why = "the bucket does not exist (create it, or fix batches.s3.bucket / endpoint)"
        elif status == 403 or code in _KEY_CODES:
            why = (
                f"access denied{f' ({code})' if code else ''}: check the keys in "
                f"{self.options.access_key_id_env} / {self.options.secret_access_key_env} "
                f"(/ {self.options.session_token_env}), "
                "batches.s3.region and the bucket's policy"
            )
        elif status in (301, 307, 400) and code in ("PermanentRedirect", "AuthorizationHeaderMalformed"):
            why = f"{code}: the bucket is in another region than batches.s3.region or endpoint"
        else:
            why = f"HTTP {status}{f' {code}' if code else ''}"
        return S3StoreError(f"S3 {method} {self._what(key)}: {why}")


def _code(body: bytes) -> str:
    """The `<Code>` of an S3 error document ("" when there is none)."""
    found = _CODE.search(body[:4096])
    return found.group(1).decode(errors="replace") if found else ""
