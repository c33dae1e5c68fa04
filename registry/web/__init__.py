"""Server-rendered web pages of the registry (models, versions, lineage, diff, drift, audit) for `normbridge serve`.

`router` is a FastAPI APIRouter; `install(app)` (called by registry.http.app.create_app)
includes it next to the API. Pages use the API's tokens, kept in an HttpOnly
cookie after /ui/login, and its model scopes.
"""

from .router import router


def install(app) -> None:
    """Serve the pages under /ui (and redirect / there) on the API's FastAPI app."""
    app.include_router(router)


__all__ = ["install", "router"]
