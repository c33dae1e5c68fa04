"""/docs (Swagger UI) and /redoc served from installed files, so they render on a machine without internet access.

FastAPI's own pages load Swagger UI and ReDoc from a CDN (and ReDoc its fonts from Google), so
they were blank offline and told a third party whenever someone opened them. The assets come
from the `fastapi-offline` package (the `server` extra), which ships swagger-ui-bundle.js,
swagger-ui.css and redoc.standalone.js; they are mounted under ASSETS_URL and FastAPI's
get_swagger_ui_html / get_redoc_html point at them. The pages carry a Content-Security-Policy that
confines them to this server: ReDoc 3 shows a "Redocly" badge whose image it loads from
cdn.redoc.ly, and that request is never sent (the badge falls back to its text).
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
ASSETS_URL = "/static/api-docs"
ASSETS_PACKAGE = "fastapi_offline"
ASSET_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
#: Everything from this server only; inline scripts and styles because both pages are built that way, blob:
#: workers for ReDoc's search.
DOCS_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def assets_folder() -> str:
    """The folder of the installed Swagger UI and ReDoc files; a clear error when the `server` extra is missing."""
    try:
        folder = resources.files(ASSETS_PACKAGE) / "static"
    except ModuleNotFoundError as error:
        raise RuntimeError(
            f"the API docs need the '{ASSETS_PACKAGE.replace('_', '-')}' package for their Swagger UI and ReDoc files; "
            "install normbridge[server]."
        ) from error
    missing = [name for name in ASSET_FILES if not (folder / name).is_file()]
    if missing:
        raise RuntimeError(
            f"the installed '{ASSETS_PACKAGE}' lacks {', '.join(missing)} in {folder}; reinstall normbridge[server]."
        )
    return str(folder)


def _confined(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = DOCS_POLICY
    return page


def install(app: FastAPI) -> None:
    """Mount the assets and add /docs, its OAuth2 redirect and /redoc (create the app with docs_url=None,
    redoc_url=None)."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_folder()), name="api-docs-assets")

    def asset(request: Request, name: str) -> str:
        return f"{request.scope.get('root_path', '')}{ASSETS_URL}/{name}"

    @app.get(DOCS_URL, include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        return _confined(
            get_swagger_ui_html(
                openapi_url=f"{request.scope.get('root_path', '')}{app.openapi_url}",
                title=f"{app.title} - Swagger UI",
                oauth2_redirect_url=app.swagger_ui_oauth2_redirect_url,
                swagger_js_url=asset(request, "swagger-ui-bundle.js"),
                swagger_css_url=asset(request, "swagger-ui.css"),
                swagger_favicon_url=asset(request, "favicon.png"),
                swagger_ui_parameters=app.swagger_ui_parameters,
            )
        )

    @app.get(app.swagger_ui_oauth2_redirect_url, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return _confined(get_swagger_ui_oauth2_redirect_html())

    @app.get(REDOC_URL, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        return _confined(
            get_redoc_html(
                openapi_url=f"{request.scope.get('root_path', '')}{app.openapi_url}",
                title=f"{app.title} - ReDoc",
                redoc_js_url=asset(request, "redoc.standalone.js"),
                redoc_favicon_url=asset(request, "favicon.png"),
                with_google_fonts=False,
            )
        )


__all__ = ["ASSETS_URL", "DOCS_POLICY", "DOCS_URL", "REDOC_URL", "assets_folder", "install"]
