"""A local server of the Hugging Face Hub's HTTP API, the part that reading dataset files
needs: a revision's commit, a paginated tree listing, and ``resolve`` with ranges (large
files redirected to a "CDN" path on the same server, as the Hub does). Repositories are held
in memory; private ones need the server's token; ``throttle`` answers the next requests with
429. It records every request (path, and whether it carried a token) for tests to check."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiohttp import web

from zephon.testing._loop import AppServer

__all__ = ["HubServer"]

LARGE = 64 * 1024  # files at least this large are served through the CDN redirect


@dataclass
class _Repo:
    private: bool = False
    refs: dict[str, str] = field(default_factory=dict)  # branch, tag or ref -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> files


class HubServer:
    """The Hub's dataset-file API on a free local port (``start()`` returns its URL)."""

    def __init__(
        self, token: str = "hf_test_token_0123456789", page_size: int = 3, large: int = LARGE
    ) -> None:
        self.token = token
        self.page_size = page_size
        self.large = large
        self.repos: dict[str, _Repo] = {}
        self.requests: list[tuple[str, str, bool]] = []  # (method, path, had a token)
        self.throttle = 0
        app = web.Application(middlewares=[self._middleware])
        base = "/{org}/{name}"
        app.router.add_get("/api/datasets" + base + "/revision/{rev:.+}", self._revision)
        app.router.add_get("/api/datasets" + base + "/tree/{rest:.*}", self._tree)
        app.router.add_route("*", "/datasets" + base + "/resolve/{rest:.+}", self._resolve)
        app.router.add_route("*", "/cdn/{digest}", self._cdn)
        self._server = AppServer(app)
        self._blobs: dict[str, bytes] = {}
        self.url = ""

    def add(
        self, repo: str, files: dict[str, bytes], revision: str = "main", private: bool = False
    ) -> str:
        """A commit of ``files`` in ``repo`` (created if new) that ``revision`` then names;
        returns the commit."""
        entry = self.repos.setdefault(repo, _Repo())
        entry.private = entry.private or private
        digest = hashlib.sha1(repr(sorted(files.items())).encode() + revision.encode())
        sha = digest.hexdigest()
        entry.commits[sha] = dict(files)
        entry.refs[revision] = sha
        return sha

    def start(self) -> str:
        self.url = self._server.start()
        return self.url

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> HubServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API ---------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        self.requests.append((request.method, request.path, bool(auth)))
        if self.throttle > 0:
            self.throttle -= 1
            return web.Response(status=429, text="rate limited")
        return await handler(request)  # type: ignore[no-any-return]

    def _repo(self, request: web.Request) -> _Repo:
        name = f"{request.match_info['org']}/{request.match_info['name']}"
        repo = self.repos.get(name)
        if repo is None:
            raise web.HTTPNotFound(text=json.dumps({"error": "Repository not found"}))
        if repo.private and request.headers.get("Authorization") != f"Bearer {self.token}":
            raise web.HTTPUnauthorized(text=json.dumps({"error": "Invalid credentials"}))
        return repo

    @staticmethod
    def _commit(repo: _Repo, rev: str) -> str:
        sha = repo.refs.get(rev, rev if rev in repo.commits else None)
        if sha is None:
            raise web.HTTPNotFound(text=json.dumps({"error": "Revision not found"}))
        return sha

    def _split(self, repo: _Repo, rest: str) -> tuple[str, str]:
        """``revision/path``: the longest known revision (refs may hold slashes)."""
        for rev in sorted([*repo.refs, *repo.commits], key=len, reverse=True):
            if rest == rev or rest.startswith(rev + "/"):
                return self._commit(repo, rev), rest[len(rev) + 1 :]
        raise web.HTTPNotFound(text=json.dumps({"error": "Revision not found"}))

    async def _revision(self, request: web.Request) -> web.Response:
        repo = self._repo(request)
        return web.json_response({"sha": self._commit(repo, request.match_info["rev"])})

    async def _tree(self, request: web.Request) -> web.Response:
        repo = self._repo(request)
        sha, folder = self._split(repo, request.match_info["rest"])
        files = repo.commits[sha]
        under = sorted(p for p in files if not folder or p.startswith(folder.rstrip("/") + "/"))
        if folder and not under:
            raise web.HTTPNotFound(text=json.dumps({"error": "Entry not found"}))
        start = int(request.query.get("cursor", "0"))
        page = under[start : start + self.page_size]
        body = []
        for path in page:
            data = files[path]
            entry: dict[str, Any] = {"type": "file", "path": path, "size": len(data)}
            entry["oid"] = hashlib.sha1(data).hexdigest()
            if len(data) >= self.large:
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data)}
            body.append(entry)
        headers = {}
        if start + self.page_size < len(under):
            nxt = request.url.update_query(cursor=str(start + self.page_size))
            headers["Link"] = f'<{nxt}>; rel="next"'
        return web.json_response(body, headers=headers)

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        repo = self._repo(request)
        sha, path = self._split(repo, request.match_info["rest"])
        data = repo.commits[sha].get(path)
        if data is None:
            raise web.HTTPNotFound(text=json.dumps({"error": "Entry not found"}))
        if len(data) >= self.large:  # large files live on the CDN: a redirect, as the Hub does
            digest = hashlib.sha256(data).hexdigest()
            self._blobs[digest] = data
            # another origin (localhost for 127.0.0.1), as the Hub's CDN is another host
            cdn = request.url.with_host("localhost").with_path(f"/cdn/{quote(digest)}")
            headers = {"Location": str(cdn.with_query(None)), "X-Linked-Size": str(len(data))}
            headers["X-Linked-Etag"] = f'"{digest}"'
            return web.Response(status=302, headers=headers)
        return _ranged(request, data, hashlib.sha1(data).hexdigest())

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        data = self._blobs.get(request.match_info["digest"])
        if data is None:
            raise web.HTTPNotFound()
        return _ranged(request, data, request.match_info["digest"])


def _ranged(request: web.Request, data: bytes, etag: str) -> web.Response:
    headers = {"ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
    spec = request.headers.get("Range", "")
    if request.method == "HEAD":
        return web.Response(headers={**headers, "Content-Length": str(len(data))})
    if spec.startswith("bytes="):
        a, _, b = spec[len("bytes=") :].partition("-")
        start, stop = int(a), min(len(data), int(b) + 1 if b else len(data))
        if start >= len(data):
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        return web.Response(status=206, body=data[start:stop], headers=headers)
    return web.Response(body=data, headers=headers)
