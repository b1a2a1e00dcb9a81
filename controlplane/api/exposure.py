"""Whether the API may serve as configured, and what it tells the operator at start.

Owns the start-up rules of an open API. Without ``KVWISE_API_TOKEN`` anyone who reaches
the port can change or roll back the policy, so the controller refuses to bind anything
but a loopback address that way unless ``KVWISE_ALLOW_OPEN_API`` says so, and it warns
at every start that runs open: a warning on loopback, an error-level line on any other
address. (Empty or blank tokens never get this far: the settings refuse them.) It also
owns how the API's address is written for people (``host_port``). It must never read or
log a token's value.
"""

from __future__ import annotations

import ipaddress
import logging

from controlplane.service.settings import ControllerSettings

log = logging.getLogger(__name__)


class UnsafeExposure(ValueError):
    """The API would be open to the network without the operator having said so."""


def host_port(host: str, port: int) -> str:
    """``host:port`` as a URL writes it: an IPv6 address in brackets (``[::1]:8080``), so
    the port never reads as part of the address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine (``localhost``, 127.0.0.0/8, ``::1``).
    Any other name counts as the network: it may resolve anywhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: ControllerSettings) -> None:
    """Raise ``UnsafeExposure`` for an open API on a non-loopback address, unless allowed."""
    if settings.api_token is not None or is_loopback(settings.host) or settings.allow_open_api:
        return
    raise UnsafeExposure(
        f"refusing to serve an open API on {settings.host}: without KVWISE_API_TOKEN anyone "
        "who reaches it can change the policy. Set KVWISE_API_TOKEN, bind 127.0.0.1, or "
        "set KVWISE_ALLOW_OPEN_API=1 to accept that"
    )


def announce_exposure(settings: ControllerSettings) -> None:
    """Log, once at start, who may call the API."""
    where = host_port(settings.host, settings.port)
    if settings.api_token is None and is_loopback(settings.host):
        log.warning(
            "the API on %s is open: no KVWISE_API_TOKEN, so any local process can change "
            "the policy",
            where,
        )
    elif settings.api_token is None:
        log.error(
            "THE API ON %s IS OPEN TO THE NETWORK: no KVWISE_API_TOKEN and "
            "KVWISE_ALLOW_OPEN_API is set, so anyone who reaches this port can change or "
            "roll back the policy",
            where,
        )
    elif settings.api_read_token is None:
        log.info("the API on %s: mutations need the API token; reads are open", where)
    else:
        log.info("the API on %s: mutations need the API token, reads a token", where)
