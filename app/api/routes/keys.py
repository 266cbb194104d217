"""API keys: create, list, revoke; who am I."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, status

from app.api import examples
from app.api.deps import AdminDep, RuntimeDep, ViewerDep, forget_keys, in_thread, typed_body
from app.api.openapi import (
    AUTHENTICATED,
    WITH_BODY,
    answers,
    body_doc,
    problems,
)
from app.services import schemas
from app.services.auth import create_key, list_keys, revoke_key
from app.services.errors import NotFound

router = APIRouter()


@router.post(
    "/v1/keys",
    tags=["keys"],
    status_code=status.HTTP_201_CREATED,
    **answers(schemas.CreatedKey),
    responses=problems(*WITH_BODY),
    openapi_extra=body_doc(schemas.KeyRequest, examples.KEY),
)
async def new_key(
    runtime: RuntimeDep,
    caller: AdminDep,
    body: Annotated[schemas.KeyRequest, typed_body(schemas.KeyRequest)],
) -> schemas.CreatedKey:
    """Create an API key (admin); the secret is shown once."""
    role, label, project = body.role, body.label, body.project
    key_id, secret = await in_thread(
        runtime,
        create_key,
        engine=runtime.engine,
        role=role,
        label=label,
        actor_key_id=caller.key_id,
        project=project,
    )
    return schemas.CreatedKey(id=key_id, role=role, label=label, key=secret, project=project)


@router.get(
    "/v1/keys", tags=["keys"], **answers(schemas.KeyPage), responses=problems(*AUTHENTICATED)
)
async def list_api_keys(
    runtime: RuntimeDep,
    _: AdminDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        int, Query(ge=0, le=2_147_483_647, description="Return keys with id > after")
    ] = 0,
) -> schemas.KeyPage:
    """API keys (admin): id, role, label, created and revoked times — never a secret."""
    return await in_thread(runtime, list_keys, engine=runtime.engine, limit=limit, after=after)


@router.delete(
    "/v1/keys/{key_id}",
    tags=["keys"],
    **answers(schemas.RevokedKey),
    responses=problems(
        *AUTHENTICATED, 404, 409, s404="No such key", s409="The last active admin key"
    ),
)
async def drop_key(
    runtime: RuntimeDep, caller: AdminDep, key_id: Annotated[int, Path(ge=1, le=2_147_483_647)]
) -> schemas.RevokedKey:
    """Revoke an API key (admin)."""
    revoked = await in_thread(
        runtime, revoke_key, engine=runtime.engine, key_id=key_id, actor_key_id=caller.key_id
    )
    if not revoked:
        raise NotFound("no key with that id")
    await forget_keys(runtime, [key_id])  # here at once, elsewhere when announced
    return schemas.RevokedKey(id=key_id, revoked=True)


@router.get(
    "/v1/whoami", tags=["keys"], **answers(schemas.WhoAmI), responses=problems(*AUTHENTICATED)
)
async def whoami(caller: ViewerDep) -> schemas.WhoAmI:
    """The calling key's id and role (never its secret); 401 for a missing or bad key."""
    project = caller.scope.project if caller.scope is not None else None
    return schemas.WhoAmI(key_id=caller.key_id, role=caller.role, project=project)
