"""A local stand-in for the Hugging Face Hub's HTTP API, enough for `Trainer.push_to_hub` through the real
`huggingface_hub` client (`HF_ENDPOINT=http://127.0.0.1:PORT`): it creates repos, answers the pre-upload check
(every file as a regular git blob, sent inline), accepts commits and records each one file by file, with the
Authorization header of every request. `reject_token=True` answers 401 to every call, as the Hub does to a bad
token; `reject_commits=True` creates repos but answers 403 to commits (a token revoked, or read-only, by the time
the run uploads). Loopback only; it serves until `close()`."""

import base64
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHub:
    def __init__(self, reject_token: bool = False, reject_commits: bool = False):
        self.reject_token, self.reject_commits = reject_token, reject_commits
        self.repos: list[str] = []
        self.commits: list[dict] = []  # {"repo", "header", "files": {path: bytes}}
        self.authorizations: list[str | None] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, code: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if code == 401:
                    self.send_header("X-Error-Message", "Invalid credentials in Authorization header")
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> bytes:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                return gzip.decompress(data) if self.headers.get("Content-Encoding") == "gzip" else data

            def do_GET(self):
                hub.authorizations.append(self.headers.get("Authorization"))
                if hub.reject_token:
                    return self._reply(401, {"error": "Invalid credentials in Authorization header"})
                self._reply(404, {"error": f"not served here: GET {self.path}"})

            def do_POST(self):
                hub.authorizations.append(self.headers.get("Authorization"))
                body = self._body()
                if hub.reject_token:
                    return self._reply(401, {"error": "Invalid credentials in Authorization header"})
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:2] == ["api", "repos"] and parts[2] == "create":
                    request = json.loads(body)
                    repo = "/".join(filter(None, [request.get("organization"), request["name"]]))
                    hub.repos.append(repo)
                    return self._reply(200, {"url": f"{hub.endpoint}/{repo}", "name": repo, "id": repo})
                if parts[:2] == ["api", "validate-yaml"]:
                    return self._reply(200, {})
                if parts[0] == "api" and parts[1] == "models" and parts[-2] == "preupload":
                    files = json.loads(body)["files"]
                    return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                        "shouldIgnore": False} for f in files]})  # fmt: skip
                if parts[0] == "api" and parts[1] == "models" and parts[-2] == "commit":
                    if hub.reject_commits:
                        return self._reply(403, {"error": "You don't have the rights to write to this repository"})
                    repo = "/".join(parts[2:-2])
                    commit = {"repo": repo, "header": None, "files": {}}
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "header":
                            commit["header"] = item["value"]
                        elif item["key"] == "file":
                            value = item["value"]
                            commit["files"][value["path"]] = base64.b64decode(value["content"])
                    hub.commits.append(commit)
                    oid = f"{len(hub.commits):040x}"
                    return self._reply(200, {"commitUrl": f"{hub.endpoint}/{repo}/commit/{oid}",
                                             "commitOid": oid, "pullRequestUrl": None})  # fmt: skip
                self._reply(404, {"error": f"not served here: POST {self.path}"})

        return Handler
