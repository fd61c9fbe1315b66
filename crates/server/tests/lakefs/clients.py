"""lakeFS's own Python clients (lakefs-sdk and lakefs, pinned in
scripts/ensure-lakefs-clients.sh) against this service's /lakefs API.

Run by tests/http/lakefs_clients.rs against a live server, with LAKEFS_HOST,
LAKEFS_ACCESS_KEY_ID and LAKEFS_SECRET_ACCESS_KEY set. Exits non-zero, with
the failed assertion, on the first difference from what the clients
expect of lakeFS.
"""

import os
import time

import lakefs
import lakefs_sdk
from lakefs.exceptions import (
    ConflictException,
    NotAuthorizedException,
    NotFoundException as HlNotFound,
    ObjectNotFoundException,
    PermissionException,
)
from lakefs_sdk.exceptions import NotFoundException, UnauthorizedException

HOST = os.environ["LAKEFS_HOST"]
AK = os.environ["LAKEFS_ACCESS_KEY_ID"]
SK = os.environ["LAKEFS_SECRET_ACCESS_KEY"]
REPO, BRANCH = "compat-repo", "main"


def check(what, got, want):
    assert got == want, f"{what}: got {got!r}, want {want!r}"


client = lakefs.Client(host=HOST, username=AK, password=SK)
sdk = client.sdk_client

# Setup calls: the configuration and who we are.
assert client.version, "a version from /config"
check("current user", sdk.auth_api.get_current_user().user.id, "admin")

# A repository, with its one branch; creating it again is a conflict.
repo = lakefs.repository(REPO, client=client).create(
    storage_namespace=f"s3://bucket/{REPO}", default_branch=BRANCH
)
check("repository id", repo.properties.id, REPO)
check("default branch", repo.properties.default_branch, BRANCH)
try:
    lakefs.repository(REPO, client=client).create(storage_namespace=f"s3://bucket/{REPO}")
    raise AssertionError("a second create of the same name succeeded")
except ConflictException as e:
    check("conflict status", e.status_code, 409)
same = lakefs.repository(REPO, client=client).create(
    storage_namespace=f"s3://bucket/{REPO}", exist_ok=True
)
check("exist_ok gives the repository", same.properties.id, REPO)
listed = [r.id for r in sdk.repositories_api.list_repositories(prefix="compat").results]
assert REPO in listed, listed
branch = repo.branch(BRANCH)

# Objects staged by metadata (stageObject), and one linked to a staged
# address (getPhysicalAddress + linkPhysicalAddress).
paths = ["a/1", "a/2", "a/b/3", "b/1", "c", "d"]
for p in paths:
    staged = sdk.internal_api.stage_object(
        REPO,
        BRANCH,
        p,
        lakefs_sdk.ObjectStageCreation(
            physical_address=f"s3://bucket/{REPO}/data/{p}",
            checksum="etag-" + p,
            size_bytes=len(p),
            mtime=int(time.time()),
            metadata={"k": "v"},
            content_type="text/plain",
        ),
    )
    check("staged path", staged.path, p)
location = sdk.staging_api.get_physical_address(REPO, BRANCH, "e")
assert location.physical_address.startswith(f"s3://bucket/{REPO}/data/"), location
linked = sdk.staging_api.link_physical_address(
    REPO,
    BRANCH,
    "e",
    lakefs_sdk.StagingMetadata(staging=location, checksum="etag-e", size_bytes=1),
)
check("linked address", linked.physical_address, location.physical_address)

# Stat and exists (HEAD).
info = branch.object("a/1").stat()
check("stat path", info.path, "a/1")
check("stat size", info.size_bytes, 3)
check("stat metadata", info.metadata, {"k": "v"})
check("stat content type", info.content_type, "text/plain")
assert branch.object("a/1").exists()
assert not branch.object("nope").exists()
bare = sdk.objects_api.stat_object(REPO, BRANCH, "a/1", user_metadata=False)
check("stat without user metadata", bare.metadata, {})

# Listing: pages of 2 with a delimiter, common prefixes folded.
pages, after = [], ""
while True:
    res = sdk.objects_api.list_objects(REPO, BRANCH, prefix="", delimiter="/", amount=2, after=after)
    pages.append([(o.path, o.path_type) for o in res.results])
    check("results count", res.pagination.results, len(res.results))
    if not res.pagination.has_more:
        check("last next_offset", res.pagination.next_offset, "")
        break
    after = res.pagination.next_offset
check(
    "pages",
    pages,
    [
        [("a/", "common_prefix"), ("b/", "common_prefix")],
        [("c", "object"), ("d", "object")],
        [("e", "object")],
    ],
)
check(
    "under a prefix",
    [o.path for o in repo.ref(BRANCH).objects(prefix="a/", max_amount=10)],
    ["a/1", "a/2", "a/b/3"],
)
check(
    "the next level",
    [(type(o).__name__, o.path) for o in branch.objects(prefix="a/", delimiter="/")],
    [("ObjectInfo", "a/1"), ("ObjectInfo", "a/2"), ("CommonPrefix", "a/b/")],
)
everything = [o.path for o in branch.objects()]
check("everything, paged by the client", everything, sorted(paths + ["e"]))

# Errors: a missing object, a wrong ref, a bad credential.
try:
    branch.object("missing").stat()
    raise AssertionError("a missing object was found")
except ObjectNotFoundException as e:
    check("missing object", e.status_code, 404)
try:
    sdk.objects_api.stat_object(REPO, "no-such-ref", "a/1")
    raise AssertionError("a wrong ref was found")
except NotFoundException as e:
    check("wrong ref", e.status, 404)
    assert "message" in e.body, e.body
try:
    lakefs.repository("no-such-repo", client=client).properties
    raise AssertionError("a missing repository was found")
except HlNotFound as e:
    check("missing repository", e.status_code, 404)
bad = lakefs.Client(host=HOST, username=AK, password="wrong-secret")
try:
    bad.version
    raise AssertionError("a wrong secret was accepted")
except NotAuthorizedException as e:
    check("wrong secret", e.status_code, 401)
try:
    lakefs.repository(REPO, client=bad).branch(BRANCH).object("a/1").stat()
    raise AssertionError("a wrong secret read an object")
except PermissionException as e:
    check("wrong secret on an object", e.status_code, 401)
try:
    bad.sdk_client.objects_api.stat_object(REPO, BRANCH, "a/1")
    raise AssertionError("a wrong secret read an object")
except UnauthorizedException as e:
    check("wrong secret, sdk", e.status, 401)

# Bearer works too.
bearer = lakefs.Client(host=HOST, access_token=SK)
check("bearer user", bearer.sdk_client.auth_api.get_current_user().user.id, "admin")

# A new pair from the API (createCredentials, what `lakectl auth users
# credentials create` calls): it works at once, and another user's pair is
# the admin's to make, not a user's.
creds = sdk.auth_api.create_credentials("admin")
check("access key id is the token's id", len(creds.access_key_id), 16)
fresh = lakefs.Client(
    host=HOST, username=creds.access_key_id, password=creds.secret_access_key
)
check("new pair's user", fresh.sdk_client.auth_api.get_current_user().user.id, "admin")
try:
    sdk.auth_api.create_credentials("nobody-here")
    raise AssertionError("credentials for a user who does not exist")
except NotFoundException as e:
    check("no such user", e.status, 404)

# Deletes: one, several, then the repository.
branch.object("c").delete()
assert not branch.object("c").exists()
branch.delete_objects(["d", "e", "never-there"])
check("after deletes", [o.path for o in branch.objects()], ["a/1", "a/2", "a/b/3", "b/1"])
repo.delete()
try:
    lakefs.repository(REPO, client=client).properties
    raise AssertionError("a deleted repository was found")
except HlNotFound:
    pass
print("lakeFS clients: all checks passed")
