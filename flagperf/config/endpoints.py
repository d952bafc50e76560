"""A running OpenAI-compatible server a serving case loads (its ``endpoint``, or an inventory's ``endpoints``).

Here, below the hosts and the families, so that an inventory's entries are checked when the inventory is read
(``flagperf validate inventory.yaml``), by the same model the case's config uses.

Secrets stay out of config files, and so out of plan.json, result.json, serving.json and every log: the key is
only ever a ``${NAME}`` reference, and a URL with credentials in it (``user:password@``) or a query (``?key=``)
is refused. Errors about these two keys never quote the value (HIDDEN_INPUT).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from flagperf.config.models import HIDDEN_INPUT, check_name

REFERENCE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")  # ${NAME}: read from the environment where the load runs


def _refused(message: str) -> PydanticCustomError:
    """An error whose line names the key but never quotes the value (it may be a secret)."""
    return PydanticCustomError(HIDDEN_INPUT, message)


def url_problem(value: object) -> str | None:
    """Why ``value`` is no base URL of an OpenAI-compatible server, or None."""
    if not isinstance(value, str):
        return "must be an http:// or https:// URL (a string)"
    if not value.isprintable() or any(c.isspace() for c in value):
        return "must be an http:// or https:// URL without spaces or control characters"
    try:
        parts = urlsplit(value)
        port = parts.port  # ValueError when out of range or not a number
    except ValueError:
        return "must be an http:// or https:// URL with a port of 1 to 65535"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if "@" in parts.netloc:
        return ("holds credentials (user:password@); not read: give the key as api_key: ${NAME}, a variable of "
                "the environment the load runs in")
    if parts.query or parts.fragment or "?" in value or "#" in value:
        return "has a query or fragment; the /v1/... paths are appended to it (a key goes in api_key: ${NAME})"
    if port == 0:
        return "must be an http:// or https:// URL with a port of 1 to 65535"
    return None


class Endpoint(BaseModel):
    """A server that is already running (the round starts none): OpenAI-compatible base URL."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    base_url: str = Field(description="e.g. http://10.0.0.5:8000 (the /v1/... paths are added)")
    model: str = Field(min_length=1, max_length=1024, description="the `model` field of each request")
    api_key: str | None = Field(default=None, description="${NAME}: a variable of the environment the load "
                                                          "runs in (a host's inventory env may set it)")
    devices: int = Field(default=1, ge=1, le=1_000_000, description="accelerators behind the endpoint "
                                                                    "(per-device figures)")
    client_host: str | None = Field(default=None, description="the inventory's host that sends the load (the "
                                                              "benchmark client); needed where it has several hosts")

    @field_validator("base_url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> str:
        problem = url_problem(value)
        if problem:
            raise _refused(problem)
        return str(value).rstrip("/")

    @field_validator("client_host")
    @classmethod
    def _host_name(cls, value: str | None) -> str | None:
        return value if value is None else check_name(value, "host name")

    @field_validator("api_key", mode="before")
    @classmethod
    def _key(cls, value: Any) -> str | None:
        if value is not None and not (isinstance(value, str) and REFERENCE.match(value)):
            raise _refused("must be a ${NAME} reference to an environment variable, never the key itself; "
                           "not shown")
        return value
