"""Who may do what. The REST API takes the SDK's API key (`X-API-Key`); every envd request
names its sandbox (`E2b-Sandbox-Id`) and carries that sandbox's access token
(`X-Access-Token`), issued at create and known only to whoever created or connected to it.
A token opens only its own sandbox: it is compared against the token of the sandbox the
request names, so one sandbox's token never reaches another's files or processes."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping

from venusrl.sandbox.e2b.errors import RestError

API_KEY_HEADER = "x-api-key"
SANDBOX_HEADER = "e2b-sandbox-id"
TOKEN_HEADER = "x-access-token"


def new_access_token() -> str:
    return secrets.token_urlsafe(32)


def same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def check_api_key(headers: Mapping[str, str], api_key: str) -> None:
    if not same(headers.get(API_KEY_HEADER), api_key):
        raise RestError(401, "X-API-Key: missing or not this service's API key")


def sandbox_named(headers: Mapping[str, str]) -> str:
    sandbox_id = headers.get(SANDBOX_HEADER)
    if not sandbox_id:
        raise RestError(400, "E2b-Sandbox-Id: header required (the SDK sends it; set E2B_SANDBOX_URL to this service)")
    return sandbox_id


def check_access_token(headers: Mapping[str, str], token: str) -> None:
    if not same(headers.get(TOKEN_HEADER), token):
        raise RestError(401, "X-Access-Token: missing or not this sandbox's access token")
