"""The error a request gets back, and the HTTP status of each file-operation failure."""

from __future__ import annotations

__all__ = ["FILE_OP_STATUS", "RequestError"]

FILE_OP_STATUS = {
    "bad_request": 400,
    "path_escape": 403,
    "not_found": 404,
    "is_directory": 400,
    "not_regular": 400,
    "too_large": 413,
    "quota_exceeded": 507,
}


class RequestError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
