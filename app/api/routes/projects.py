"""Projects (admin): tenants with a label scope and an ε quota, inherited by their keys."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from app.api import examples
from app.api.deps import AdminDep, RuntimeDep, forget_keys, in_thread, typed_body
from app.api.openapi import AUTHENTICATED, WITH_BODY, answers, body_doc, problems
from app.services import projects as project_service
from app.services import schemas

router = APIRouter(prefix="/v1/projects", tags=["projects"])

#: A project's unique name (any other text is simply not found).
ProjectName = Annotated[str, Path(description="The project's unique name")]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    **answers(schemas.ProjectView),
    openapi_extra=body_doc(schemas.ProjectRequest, examples.PROJECT),
    responses=problems(*WITH_BODY, 409, s409="already-exists: a project with this name exists"),
)
async def create_project(
    runtime: RuntimeDep,
    caller: AdminDep,
    body: Annotated[schemas.ProjectRequest, typed_body(schemas.ProjectRequest)],
) -> schemas.ProjectView:
    """Create a project (admin): its keys see only objects in its scope, within its quota."""
    return await in_thread(
        runtime,
        project_service.create_project,
        engine=runtime.engine,
        request=body,
        actor_key_id=caller.key_id,
    )


@router.get("", **answers(schemas.ProjectPage), responses=problems(*AUTHENTICATED))
async def list_projects(
    runtime: RuntimeDep,
    _: AdminDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[int, Query(ge=0, le=2_147_483_647, description="The previous next_after")] = 0,
) -> schemas.ProjectPage:
    """Projects in creation order (admin)."""
    return await in_thread(
        runtime, project_service.list_projects, engine=runtime.engine, limit=limit, after=after
    )


_NOT_FOUND = problems(*AUTHENTICATED, 404, s404="No such project")


@router.get("/{name}", **answers(schemas.ProjectView), responses=_NOT_FOUND)
async def get_project(runtime: RuntimeDep, _: AdminDep, name: ProjectName) -> schemas.ProjectView:
    """A project's scope and quota (admin)."""
    return await in_thread(runtime, project_service.get_project, engine=runtime.engine, name=name)


@router.patch(
    "/{name}",
    **answers(schemas.ProjectView),
    openapi_extra=body_doc(schemas.ProjectPatch, examples.PROJECT_PATCH),
    responses=problems(*WITH_BODY, 404, s404="No such project"),
)
async def change_project_quota(
    runtime: RuntimeDep,
    caller: AdminDep,
    name: ProjectName,
    body: Annotated[schemas.ProjectPatch, typed_body(schemas.ProjectPatch)],
) -> schemas.ProjectView:
    """Change a project's quota (admin); its scope is fixed."""
    return await in_thread(
        runtime,
        project_service.change_quota,
        engine=runtime.engine,
        name=name,
        request=body,
        actor_key_id=caller.key_id,
    )


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=_NOT_FOUND,
)
async def delete_project(runtime: RuntimeDep, caller: AdminDep, name: ProjectName) -> Response:
    """Delete a project (admin): its keys are revoked; its name and its loss stay on record."""
    revoked = await in_thread(
        runtime,
        project_service.delete_project,
        engine=runtime.engine,
        name=name,
        actor_key_id=caller.key_id,
    )
    await forget_keys(runtime, list(revoked))  # here at once, elsewhere when announced
    return Response(status_code=status.HTTP_204_NO_CONTENT)
