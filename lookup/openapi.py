"""The OpenAPI document, built from the request models so it cannot drift from validation."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}


def answer(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {}}}


ERRORS = {
    "400": answer("body is not JSON"),
    "401": answer("bearer token missing or wrong (when auth is on)"),
    "422": answer("a field is invalid: `field` names it"),
    "503": answer("a store is down or nothing is published yet; retry after `Retry-After`"),
}


def openapi_document(search_request: type[BaseModel]) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "precompute lookup", "version": "1"},
        "paths": {
            "/v1/search": {
                "post": {
                    "summary": "Embed the query and return the k nearest documents of the published version",
                    "requestBody": json_body(search_request),
                    "responses": {"200": answer("version and hits: id, score, payload"), **ERRORS},
                }
            },
            "/healthz": {"get": {"summary": "The process is alive", "responses": {"200": answer("ok")}}},
            "/readyz": {
                "get": {
                    "summary": "Ready once the engine is warm and a version is published",
                    "responses": {
                        "200": answer("versions served"),
                        "503": answer("not ready, with the reason"),
                    },
                }
            },
        },
    }
