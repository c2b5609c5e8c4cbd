"""The OpenAPI document, built from the served endpoints and their request models, so it cannot
drift from the routes or their validation."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from precompute.lookup.served import Endpoint


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}


def answer(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {}}}


def path_id(what: str) -> dict[str, Any]:
    return {"name": "id", "in": "path", "required": True, "description": what, "schema": {"type": "string"}}


ERRORS = {
    "400": answer("body is not JSON"),
    "401": answer("bearer token missing or wrong (when auth is on)"),
    "422": answer("a field is invalid: `field` names it"),
    "503": answer("a store is down or nothing is published yet; retry after `Retry-After`"),
}
GET_ERRORS = {
    "401": ERRORS["401"],
    "404": answer("no record for this id in the published version: `id` names it"),
    "422": ERRORS["422"],
    "503": ERRORS["503"],
}
K_PARAMETER = {
    "name": "k",
    "in": "query",
    "required": False,
    "description": "at most this many items, best first (default: all that were stored)",
    "schema": {"type": "integer", "minimum": 1},
}
SERVICE_PATHS = {
    "/healthz": {"get": {"summary": "The process is alive", "responses": {"200": answer("ok")}}},
    "/readyz": {
        "get": {
            "summary": "Ready once the engines are warm and the stores answer",
            "responses": {
                "200": answer("the version served per output, null where none is published yet"),
                "503": answer("not ready, with the reason"),
            },
        }
    },
}


def search_operation(request: type[BaseModel]) -> dict[str, Any]:
    return {
        "summary": "Embed the query and return the k nearest documents of the published version",
        "requestBody": json_body(request),
        "responses": {
            "200": answer("version and hits: id, score, payload; query_cut_to_tokens where the query was cut"),
            **ERRORS,
        },
    }


def get_operation(summary: str, id_is: str, list_key: str, takes_k: bool) -> dict[str, Any]:
    parameters = [path_id(id_is), *([K_PARAMETER] if takes_k else [])]
    return {
        "summary": summary,
        "parameters": parameters,
        "responses": {"200": answer(f"version, id, {list_key}"), **GET_ERRORS},
    }


def batch_operation(summary: str, request: type[BaseModel], list_key: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "requestBody": json_body(request),
        "responses": {"200": answer(f"version, results: id, {list_key}; missing: the ids not found"), **ERRORS},
    }


def openapi_document(endpoints: Iterable[Endpoint]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.template, {})[endpoint.method.lower()] = endpoint.operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "precompute lookup", "version": "1"},
        "paths": {**paths, **SERVICE_PATHS},
    }
