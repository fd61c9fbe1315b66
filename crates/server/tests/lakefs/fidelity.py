"""Where this service's /lakefs API answers as lakeFS answers, seen through
lakeFS's own Python clients (lakefs-sdk and lakefs, pinned in
scripts/ensure-lakefs-clients.sh): 501 for what it does not serve, 401 for
a missing permission, stageObject's mtime kept, deleteObjects' per-path
answers, a head commit id, lakeFS's limits and flags.

Run by tests/http/lakefs_clients.rs against a live server, with LAKEFS_HOST,
LAKEFS_ACCESS_KEY_ID and LAKEFS_SECRET_ACCESS_KEY (an admin's) and
LAKEFS_READER_KEY_ID and LAKEFS_READER_SECRET (a user who may read only
repository `demo`) set. Exits non-zero, with the failed assertion, on the
first difference.
"""

import base64
import json
import os
import re
import urllib.error
import urllib.request

import lakefs
import lakefs_sdk
from lakefs_sdk.exceptions import (
    ApiException,
    BadRequestException,
    ForbiddenException,
    UnauthorizedException,
)

HOST = os.environ["LAKEFS_HOST"]
AK = os.environ["LAKEFS_ACCESS_KEY_ID"]
SK = os.environ["LAKEFS_SECRET_ACCESS_KEY"]
REPO, BRANCH = "fidelity-repo", "main"


def check(what, got, want):
    assert got == want, f"{what}: got {got!r}, want {want!r}"


def sdk_for(key, secret):
    return lakefs.Client(host=HOST, username=key, password=secret).sdk_client


def refused(what, call, status, exception=ApiException):
    """Runs `call`, which must fail with `status`; returns the body's message."""
    try:
        call()
    except exception as e:
        check(f"{what}: status", e.status, status)
        return json.loads(e.body)["message"]
    raise AssertionError(f"{what}: succeeded")


sdk = sdk_for(AK, SK)
reader = sdk_for(os.environ["LAKEFS_READER_KEY_ID"], os.environ["LAKEFS_READER_SECRET"])

lakefs.repository(REPO, client=lakefs.Client(host=HOST, username=AK, password=SK)).create(
    storage_namespace=f"s3://bucket/{REPO}", default_branch=BRANCH
)

# stageObject keeps the mtime it is given, and takes an empty content type
# as lakeFS does.
staged = sdk.internal_api.stage_object(
    REPO,
    BRANCH,
    "kept/mtime",
    lakefs_sdk.ObjectStageCreation(
        physical_address=f"s3://bucket/{REPO}/data/1",
        checksum="c1",
        size_bytes=1,
        mtime=1_234_567_890,
        content_type="",
    ),
)
check("staged mtime", staged.mtime, 1_234_567_890)
stat = sdk.objects_api.stat_object(REPO, BRANCH, "kept/mtime")
check("mtime read back", stat.mtime, 1_234_567_890)
check("empty content type", stat.content_type, "application/octet-stream")

# A non-empty, stable head commit id; reading at it is history this
# server does not keep: 501, not a 404.
head = sdk.branches_api.get_branch(REPO, BRANCH).commit_id
assert re.fullmatch(r"[0-9a-f]{64}", head), head
check("stable commit id", sdk.branches_api.get_branch(REPO, BRANCH).commit_id, head)
message = refused(
    "stat at the head commit",
    lambda: sdk.objects_api.stat_object(REPO, head, "kept/mtime"),
    501,
)
assert "no commit history" in message, message

# Operations this server does not serve: 501, naming them.
for name, call in [
    (
        "commit",
        lambda: sdk.commits_api.commit(
            REPO, BRANCH, lakefs_sdk.CommitCreation(message="m")
        ),
    ),
    ("getObject", lambda: sdk.objects_api.get_object(REPO, BRANCH, "kept/mtime")),
    ("diffRefs", lambda: sdk.refs_api.diff_refs(REPO, BRANCH, BRANCH)),
    (
        "createBranch",
        lambda: sdk.branches_api.create_branch(
            REPO, lakefs_sdk.BranchCreation(name="dev", source=BRANCH)
        ),
    ),
]:
    message = refused(name, call, 501)
    assert message.startswith(f"{name} is not implemented"), message

# A user without the grant: 401 (UnauthorizedException), as lakeFS's
# authorization answers.
message = refused(
    "stat without the grant",
    lambda: reader.objects_api.stat_object(REPO, BRANCH, "kept/mtime"),
    401,
    UnauthorizedException,
)
assert message.startswith("insufficient permissions"), message

# deleteObjects: 200, each refused path listed, empty paths skipped.
answer = reader.objects_api.delete_objects(
    REPO, BRANCH, lakefs_sdk.PathList(paths=["kept/mtime", ""])
)
check(
    "per-path refusals",
    [(e.path, e.status_code, e.message) for e in answer.errors],
    [("kept/mtime", 401, "Unauthorized")],
)
answer = sdk.objects_api.delete_objects(
    REPO, BRANCH, lakefs_sdk.PathList(paths=["kept/mtime", ""])
)
check("deleted, the empty path skipped", answer.errors, [])

# presign=true: lakeFS's answer for storage that cannot pre-sign.
refused(
    "presign",
    lambda: sdk.objects_api.stat_object(REPO, BRANCH, "kept/mtime", presign=True),
    400,
    BadRequestException,
)

# amount above 1,000 is refused (the SDK checks it too, so ask directly).
auth = base64.b64encode(f"{AK}:{SK}".encode()).decode()
request = urllib.request.Request(
    f"{HOST}/api/v1/repositories/{REPO}/refs/{BRANCH}/objects/ls?amount=1001",
    headers={"Authorization": f"Basic {auth}"},
)
try:
    urllib.request.urlopen(request, timeout=10)
    raise AssertionError("amount=1001 accepted")
except urllib.error.HTTPError as e:
    check("amount above 1000", e.code, 400)
    body = json.loads(e.read())
    assert body["message"].startswith(
        'parameter "amount" in query has an error: number must be at most 1000'
    ), body

# A read-only repository is deleted only with force.
sdk.repositories_api.create_repository(
    lakefs_sdk.RepositoryCreation(
        name="fidelity-frozen", storage_namespace="s3://bucket/frozen", read_only=True
    )
)
message = refused(
    "delete a read-only repository",
    lambda: sdk.repositories_api.delete_repository("fidelity-frozen"),
    403,
    ForbiddenException,
)
check("read-only message", message, "read-only repository")
sdk.repositories_api.delete_repository("fidelity-frozen", force=True)

print("lakeFS fidelity: ok")
