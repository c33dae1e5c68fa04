"""The registry's HTTP API (FastAPI): `create_app(registry, ...)` serves /api/v1 over one Registry per process.

Public pieces for other routers: registry.http.auth (Principal, require, principal_from_token) and
registry.http.errors (ApiError, the error body). The CLI starts it with `normbridge serve`.
"""
