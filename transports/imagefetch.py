"""Image links in a person's words, fetched for a model that takes images.

IRC carries no files: people paste links.  A channel with ``image_urls`` on
(:class:`~agentik.bot.channel.ChannelKnobs`) has the links of a message for the
bot fetched here (:func:`fetch_images`) and given to the model as image parts,
stored as attachments like uploads.  Every link is hostile input:

- only ``http``/``https``; its host is resolved once, and the connection goes to
  the addresses that were checked (no second lookup an attacker's DNS could
  answer differently); loopback, private, link-local, multicast and other
  non-global addresses are refused (``[attachments] url_allow_private`` allows
  loopback and private ones, for tests and LAN setups; never link-local, where
  cloud metadata services live);
- redirects are followed by hand, at most :data:`MAX_REDIRECTS`, each hop checked
  as the first;
- ``[attachments] max_bytes`` is applied while reading (a larger announced length
  is refused before reading); ``url_timeout`` bounds each link, all its hops;
- the type comes from the bytes (PNG, JPEG, GIF, WebP), never from the name or
  the ``Content-Type``; at most ``url_max_images`` images per message.

A link is looked at as an image when its path ends in an image extension or its
server calls it ``image/*``; any other link (a web page) is left as text, without
a word.  What failed is said in one short line per link (:attr:`Fetched.notices`)
and named for the model (:attr:`Fetched.notes`); the message's text goes on.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from agentik.core.attachments import IMAGE_TYPES, AttachmentSettings, sniff
from agentik.core.messages import ImagePart

__all__ = ["MAX_LINKS", "MAX_REDIRECTS", "Fetched", "LinkRefused", "fetch_images", "links_in"]

log = logging.getLogger(__name__)

#: Redirects followed for one link.
MAX_REDIRECTS = 3
#: Links of one message looked at, at most (the rest are left as text).
MAX_LINKS = 10
_LINK = re.compile(r"https?://[^\s<>\"'\x00-\x1f\x7f]+", re.IGNORECASE)
_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".webp")
#: Punctuation that ends a sentence rather than a link (``see https://x/a.png.``).
_TRAILING = ".,;:!?)]}"


class LinkRefused(Exception):
    """A link that is not fetched, or whose answer is not taken; the message is the
    short reason shown to the person."""


@dataclass(slots=True)
class Fetched:
    """What :func:`fetch_images` found: the images (their bytes, checked), a short
    line per refused link for the person, and a note per refused link for the model."""

    images: list[ImagePart] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def links_in(text: str) -> list[str]:
    """The http(s) links of ``text``, in order, each once, at most :data:`MAX_LINKS`."""
    out: list[str] = []
    for match in _LINK.finditer(text):
        link = match.group(0).rstrip(_TRAILING)
        if link not in out:
            out.append(link)
        if len(out) == MAX_LINKS:
            break
    return out


def _looks_like_image(path: str) -> bool:
    return path.lower().endswith(_IMAGE_EXTENSIONS)


def _refused_address(address: str, allow_private: bool) -> str | None:
    """Why ``address`` may not be connected to (``None``: it may)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_global and not ip.is_multicast:
        return None
    if (
        allow_private
        and (ip.is_loopback or ip.is_private)
        and not (ip.is_link_local or ip.is_multicast or ip.is_unspecified)
    ):
        return None
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    return "a private address"


async def _resolve(host: str, port: int, allow_private: bool) -> list[dict[str, Any]]:
    """``host`` resolved once, every address checked; aiohttp's resolver records."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise LinkRefused(f"{host} could not be resolved") from exc
    records: list[dict[str, Any]] = []
    for family, _, proto, _, sockaddr in infos:
        address = str(sockaddr[0])
        why = _refused_address(address, allow_private)
        if why is not None:
            # One refused address refuses the host: a name that also points inward
            # would otherwise be a way in.
            raise LinkRefused(f"{host} is {why}")
        records.append({"hostname": host, "host": address, "port": port, "family": family,
                        "proto": proto, "flags": socket.AI_NUMERICHOST})  # fmt: skip
    if not records:
        raise LinkRefused(f"{host} could not be resolved")
    return records


class _Pinned:
    """An aiohttp resolver that answers with the addresses already checked
    (:func:`_resolve`), for the one host they belong to."""

    def __init__(self, host: str, records: list[dict[str, Any]]) -> None:
        self._host = host
        self._records = records

    async def resolve(self, host: str, port: int = 0, family: int = 0) -> list[dict[str, Any]]:
        if host != self._host:  # never: one connector per checked host
            raise OSError(f"{host} was not checked")
        return [dict(r, port=port or r["port"]) for r in self._records]

    async def close(self) -> None:
        return None


async def _fetch(link: str, settings: AttachmentSettings) -> tuple[bytes, str] | None:
    """The bytes of the image at ``link`` and its name, ``None`` for a link that is
    no image (a page: left alone), :class:`LinkRefused` for one refused."""
    import aiohttp
    from yarl import URL

    limit = settings.max_bytes
    try:
        target = URL(link)
    except ValueError as exc:
        raise LinkRefused("not a valid link") from exc
    for _ in range(MAX_REDIRECTS + 1):
        if target.scheme not in ("http", "https") or not target.host:
            raise LinkRefused("only http and https links are fetched")
        port = target.port or (443 if target.scheme == "https" else 80)
        records = await _resolve(target.host, port, settings.url_allow_private)
        connector = aiohttp.TCPConnector(
            resolver=_Pinned(target.host, records),  # type: ignore[arg-type]
            use_dns_cache=False,
            limit=1,
        )
        async with (
            aiohttp.ClientSession(connector=connector, trust_env=False) as session,
            session.get(
                target,
                allow_redirects=False,
                headers={"Accept": "image/png, image/jpeg, image/gif, image/webp"},
            ) as r,
        ):
            if r.status in (301, 302, 303, 307, 308) and "location" in r.headers:
                try:
                    target = target.join(URL(r.headers["location"]))
                except ValueError as exc:
                    raise LinkRefused("a redirect to an invalid link") from exc
                continue
            if r.status != 200:
                raise LinkRefused(f"the server answered {r.status}")
            declared = r.headers.get("content-type", "").split(";")[0].strip().lower()
            if not declared.startswith("image/") and not _looks_like_image(target.path):
                return None  # a page, not an image: the link stays text
            if r.content_length is not None and r.content_length > limit:
                raise LinkRefused(f"larger than {limit} bytes")
            data = bytearray()
            async for chunk in r.content.iter_chunked(65536):
                data += chunk
                if len(data) > limit:
                    raise LinkRefused(f"larger than {limit} bytes")
            if sniff(bytes(data)) not in IMAGE_TYPES:
                raise LinkRefused("not a PNG, JPEG, GIF or WebP image")
            name = unquote(target.path.rsplit("/", 1)[-1])[:100] or "image"
            return bytes(data), name
    raise LinkRefused(f"more than {MAX_REDIRECTS} redirects")


def _label(link: str) -> str:
    """A link as a notice names it: its host (printable, short), never its whole text."""
    from yarl import URL

    try:
        host = URL(link).host or "?"
    except ValueError:
        host = "?"
    return "".join(c for c in host if c.isprintable() and not c.isspace())[:60] or "?"


async def fetch_images(links: Sequence[str], settings: AttachmentSettings) -> Fetched:
    """The images at ``links`` (:func:`links_in`), fetched one after another under
    the rules of the module docstring; at most ``settings.url_max_images``."""
    out = Fetched()
    most = settings.url_max_images
    for n, link in enumerate(links, 1):
        where = f"link {n} ({_label(link)})"
        if len(out.images) >= most:
            if _looks_like_image(link.split("?", 1)[0]):
                out.notices.append(f"image {where} not fetched: at most {most} images per message")
                out.notes.append(f"[image {where}: not fetched, too many images]")
            continue
        try:
            async with asyncio.timeout(settings.url_timeout):
                got = await _fetch(link, settings)
        except LinkRefused as exc:
            reason = str(exc)
        except TimeoutError:
            reason = f"no answer within {settings.url_timeout:g} s"
        except Exception as exc:  # the network's failures: said, never the message lost
            log.info("image link %s: %s", _label(link), exc)
            reason = "could not be fetched"
        else:
            if got is not None:
                data, name = got
                out.images.append(ImagePart(data=data, name=name, size=len(data)))
            continue
        out.notices.append(f"image {where} not taken: {reason}")
        out.notes.append(f"[image {where}: not taken, {reason}]")
    return out
