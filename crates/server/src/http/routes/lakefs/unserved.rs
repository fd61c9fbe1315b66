//! Every operation of lakeFS's API (`api/swagger.yml`) this server does
//! not serve, so that a lakeFS client asking for one hears 501 and why,
//! not a 404 that reads as a missing repository or ref. Generated from
//! lakeFS's API definition (treeverse/lakeFS `71a45eeb`, 134 operations,
//! 21 served); a parameter after `refs/` is named `{ref}` throughout, as
//! the router needs one name per position.

use axum::http::{Method, StatusCode};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;

use super::errors::LakeError;
use crate::service::state::AppState;

/// Why an operation is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// It reads or makes commit history (commits, tags, merges, diffs,
    /// branches other than the one).
    History,
    /// It moves object data.
    Data,
    /// It manages users, groups, policies or logins.
    Auth,
    /// Anything else (actions, garbage collection, settings, setup).
    Other,
}

impl Why {
    fn says(self) -> &'static str {
        match self {
            Self::History => {
                "this server keeps no commit history: each repository has one branch, \
                 whose writes are visible at once, and no commits, tags or merges"
            }
            Self::Data => "this server stores object metadata only, no object data",
            Self::Auth => {
                "users, tokens and grants are managed with the server's command line \
                 (`pgbatch-server user ...`, `pgbatch-server token ...`)"
            }
            Self::Other => "this server does not implement it",
        }
    }
}

/// (method, path under `/api/v1`, operationId, why), by path.
pub(crate) const UNSERVED: &[(&str, &str, &str, Why)] = &[
    ("GET", "/auth/capabilities", "getAuthCapabilities", Why::Other),
    ("POST", "/auth/external/principal/login", "externalPrincipalLogin", Why::Auth),
    ("GET", "/auth/external/principals", "getExternalPrincipal", Why::Auth),
    ("GET", "/auth/groups", "listGroups", Why::Auth),
    ("POST", "/auth/groups", "createGroup", Why::Auth),
    ("DELETE", "/auth/groups/{groupId}", "deleteGroup", Why::Auth),
    ("GET", "/auth/groups/{groupId}", "getGroup", Why::Auth),
    ("GET", "/auth/groups/{groupId}/acl", "getGroupACL", Why::Auth),
    ("POST", "/auth/groups/{groupId}/acl", "setGroupACL", Why::Auth),
    ("GET", "/auth/groups/{groupId}/members", "listGroupMembers", Why::Auth),
    ("DELETE", "/auth/groups/{groupId}/members/{userId}", "deleteGroupMembership", Why::Auth),
    ("PUT", "/auth/groups/{groupId}/members/{userId}", "addGroupMembership", Why::Auth),
    ("GET", "/auth/groups/{groupId}/policies", "listGroupPolicies", Why::Auth),
    ("DELETE", "/auth/groups/{groupId}/policies/{policyId}", "detachPolicyFromGroup", Why::Auth),
    ("PUT", "/auth/groups/{groupId}/policies/{policyId}", "attachPolicyToGroup", Why::Auth),
    ("POST", "/auth/login", "login", Why::Auth),
    ("GET", "/auth/policies", "listPolicies", Why::Auth),
    ("POST", "/auth/policies", "createPolicy", Why::Auth),
    ("DELETE", "/auth/policies/{policyId}", "deletePolicy", Why::Auth),
    ("GET", "/auth/policies/{policyId}", "getPolicy", Why::Auth),
    ("PUT", "/auth/policies/{policyId}", "updatePolicy", Why::Auth),
    ("GET", "/auth/users", "listUsers", Why::Auth),
    ("POST", "/auth/users", "createUser", Why::Auth),
    ("DELETE", "/auth/users/{userId}", "deleteUser", Why::Auth),
    ("GET", "/auth/users/{userId}", "getUser", Why::Auth),
    ("GET", "/auth/users/{userId}/credentials", "listUserCredentials", Why::Auth),
    ("DELETE", "/auth/users/{userId}/credentials/{accessKeyId}", "deleteCredentials", Why::Auth),
    ("GET", "/auth/users/{userId}/credentials/{accessKeyId}", "getCredentials", Why::Auth),
    ("DELETE", "/auth/users/{userId}/external/principals", "deleteUserExternalPrincipal", Why::Auth),
    ("POST", "/auth/users/{userId}/external/principals", "createUserExternalPrincipal", Why::Auth),
    ("GET", "/auth/users/{userId}/external/principals/ls", "listUserExternalPrincipals", Why::Auth),
    ("GET", "/auth/users/{userId}/groups", "listUserGroups", Why::Auth),
    ("GET", "/auth/users/{userId}/policies", "listUserPolicies", Why::Auth),
    ("DELETE", "/auth/users/{userId}/policies/{policyId}", "detachPolicyFromUser", Why::Auth),
    ("PUT", "/auth/users/{userId}/policies/{policyId}", "attachPolicyToUser", Why::Auth),
    ("GET", "/config/garbage-collection", "getGarbageCollectionConfig", Why::Other),
    ("GET", "/oidc/callback", "oauthCallback", Why::Auth),
    ("GET", "/repositories/{repository}/actions/runs", "listRepositoryRuns", Why::Other),
    ("GET", "/repositories/{repository}/actions/runs/{run_id}", "getRun", Why::Other),
    ("GET", "/repositories/{repository}/actions/runs/{run_id}/hooks", "listRunHooks", Why::Other),
    ("GET", "/repositories/{repository}/actions/runs/{run_id}/hooks/{hook_run_id}/output", "getRunHookOutput", Why::Other),
    ("DELETE", "/repositories/{repository}/branch_protection", "internalDeleteBranchProtectionRule", Why::Other),
    ("GET", "/repositories/{repository}/branch_protection", "internalGetBranchProtectionRules", Why::Other),
    ("POST", "/repositories/{repository}/branch_protection", "internalCreateBranchProtectionRule", Why::Other),
    ("GET", "/repositories/{repository}/branch_protection/set_allowed", "createBranchProtectionRulePreflight", Why::Other),
    ("POST", "/repositories/{repository}/branches", "createBranch", Why::History),
    ("DELETE", "/repositories/{repository}/branches/{branch}", "deleteBranch", Why::History),
    ("PUT", "/repositories/{repository}/branches/{branch}", "resetBranch", Why::History),
    ("POST", "/repositories/{repository}/branches/{branch}/cherry-pick", "cherryPick", Why::History),
    ("POST", "/repositories/{repository}/branches/{branch}/commits", "commit", Why::History),
    ("GET", "/repositories/{repository}/branches/{branch}/diff", "diffBranch", Why::History),
    ("PUT", "/repositories/{repository}/branches/{branch}/hard_reset", "hardResetBranch", Why::History),
    ("DELETE", "/repositories/{repository}/branches/{branch}/import", "importCancel", Why::Data),
    ("GET", "/repositories/{repository}/branches/{branch}/import", "importStatus", Why::Data),
    ("POST", "/repositories/{repository}/branches/{branch}/import", "importStart", Why::Data),
    ("POST", "/repositories/{repository}/branches/{branch}/objects", "uploadObject", Why::Data),
    ("POST", "/repositories/{repository}/branches/{branch}/objects/copy", "copyObject", Why::Data),
    ("GET", "/repositories/{repository}/branches/{branch}/objects/stage_allowed", "uploadObjectPreflight", Why::Data),
    ("PUT", "/repositories/{repository}/branches/{branch}/objects/stat/user_metadata", "updateObjectUserMetadata", Why::Data),
    ("POST", "/repositories/{repository}/branches/{branch}/revert", "revertBranch", Why::History),
    ("POST", "/repositories/{repository}/branches/{branch}/staging/pmpu", "createPresignMultipartUpload", Why::Data),
    ("DELETE", "/repositories/{repository}/branches/{branch}/staging/pmpu/{uploadId}", "abortPresignMultipartUpload", Why::Data),
    ("PUT", "/repositories/{repository}/branches/{branch}/staging/pmpu/{uploadId}", "completePresignMultipartUpload", Why::Data),
    ("PUT", "/repositories/{repository}/branches/{branch}/staging/pmpu/{uploadId}/parts/{partNumber}", "uploadPart", Why::Data),
    ("PUT", "/repositories/{repository}/branches/{branch}/staging/pmpu/{uploadId}/parts/{partNumber}/copy", "uploadPartCopy", Why::Data),
    ("POST", "/repositories/{repository}/commits", "CreateCommitRecord", Why::History),
    ("GET", "/repositories/{repository}/commits/{commitId}", "getCommit", Why::History),
    ("GET", "/repositories/{repository}/dump", "dumpStatus", Why::Other),
    ("POST", "/repositories/{repository}/dump", "dumpSubmit", Why::Other),
    ("POST", "/repositories/{repository}/gc/prepare_commits", "prepareGarbageCollectionCommits", Why::Other),
    ("POST", "/repositories/{repository}/gc/prepare_commits/async", "prepareGarbageCollectionCommitsAsync", Why::Other),
    ("GET", "/repositories/{repository}/gc/prepare_commits/status", "prepareGarbageCollectionCommitsStatus", Why::Other),
    ("POST", "/repositories/{repository}/gc/prepare_uncommited", "prepareGarbageCollectionUncommitted", Why::Other),
    ("DELETE", "/repositories/{repository}/gc/rules", "internalDeleteGarbageCollectionRules", Why::Other),
    ("GET", "/repositories/{repository}/gc/rules", "internalGetGarbageCollectionRules", Why::Other),
    ("POST", "/repositories/{repository}/gc/rules", "internalSetGarbageCollectionRules", Why::Other),
    ("GET", "/repositories/{repository}/gc/rules/set_allowed", "setGarbageCollectionRulesPreflight", Why::Other),
    ("DELETE", "/repositories/{repository}/metadata", "deleteRepositoryMetadata", Why::Other),
    ("GET", "/repositories/{repository}/metadata", "getRepositoryMetadata", Why::Other),
    ("POST", "/repositories/{repository}/metadata", "setRepositoryMetadata", Why::Other),
    ("GET", "/repositories/{repository}/metadata/meta_range/{meta_range}", "getMetaRange", Why::History),
    ("GET", "/repositories/{repository}/metadata/object/{type}/{object_id}", "getMetadataObject", Why::Other),
    ("GET", "/repositories/{repository}/metadata/range/{range}", "getRange", Why::History),
    ("GET", "/repositories/{repository}/pulls", "listPullRequests", Why::History),
    ("POST", "/repositories/{repository}/pulls", "createPullRequest", Why::History),
    ("GET", "/repositories/{repository}/pulls/{pull_request}", "getPullRequest", Why::History),
    ("PATCH", "/repositories/{repository}/pulls/{pull_request}", "updatePullRequest", Why::History),
    ("PUT", "/repositories/{repository}/pulls/{pull_request}/merge", "mergePullRequest", Why::History),
    ("PUT", "/repositories/{repository}/refs/dump", "dumpRefs", Why::History),
    ("PUT", "/repositories/{repository}/refs/restore", "restoreRefs", Why::History),
    ("POST", "/repositories/{repository}/refs/{ref}/symlink", "createSymlinkFile", Why::Data),
    ("GET", "/repositories/{repository}/refs/{ref}/diff/{rightRef}", "diffRefs", Why::History),
    ("GET", "/repositories/{repository}/refs/{ref}/commits", "logCommits", Why::History),
    ("GET", "/repositories/{repository}/refs/{ref}/objects", "getObject", Why::Data),
    ("GET", "/repositories/{repository}/refs/{ref}/objects/underlyingProperties", "getUnderlyingProperties", Why::Data),
    ("GET", "/repositories/{repository}/refs/{ref}/merge/{destinationBranch}", "findMergeBase", Why::History),
    ("POST", "/repositories/{repository}/refs/{ref}/merge/{destinationBranch}", "mergeIntoBranch", Why::History),
    ("GET", "/repositories/{repository}/restore", "restoreStatus", Why::Other),
    ("POST", "/repositories/{repository}/restore", "restoreSubmit", Why::Other),
    ("GET", "/repositories/{repository}/settings/branch_protection", "getBranchProtectionRules", Why::Other),
    ("PUT", "/repositories/{repository}/settings/branch_protection", "setBranchProtectionRules", Why::Other),
    ("DELETE", "/repositories/{repository}/settings/gc_rules", "deleteGCRules", Why::Other),
    ("GET", "/repositories/{repository}/settings/gc_rules", "getGCRules", Why::Other),
    ("PUT", "/repositories/{repository}/settings/gc_rules", "setGCRules", Why::Other),
    ("GET", "/repositories/{repository}/tags", "listTags", Why::History),
    ("POST", "/repositories/{repository}/tags", "createTag", Why::History),
    ("DELETE", "/repositories/{repository}/tags/{tag}", "deleteTag", Why::History),
    ("GET", "/repositories/{repository}/tags/{tag}", "getTag", Why::History),
    ("POST", "/setup_comm_prefs", "setupCommPrefs", Why::Other),
    ("GET", "/setup_lakefs", "getSetupState", Why::Other),
    ("POST", "/setup_lakefs", "setup", Why::Other),
    ("POST", "/sts/login", "stsLogin", Why::Auth),
    ("GET", "/usage-report/summary", "getUsageReportSummary", Why::Other),
];

/// The answer to `operation`: 501 with lakeFS's `{"message"}`.
pub(crate) fn not_implemented(operation: &str, why: Why) -> LakeError {
    LakeError::new(
        StatusCode::NOT_IMPLEMENTED,
        "not_implemented",
        format!("{operation} is not implemented: {}", why.says()),
    )
}

/// `routes` with a 501 route for each of [`UNSERVED`]; a path both serve
/// gets the unserved methods beside the served ones.
pub(crate) fn add_to(mut routes: Router<AppState>) -> Router<AppState> {
    let mut by_path: std::collections::BTreeMap<&str, MethodRouter<AppState>> =
        std::collections::BTreeMap::new();
    for &(method, path, operation, why) in UNSERVED {
        let filter = MethodFilter::try_from(
            Method::from_bytes(method.as_bytes()).expect("a method of lakeFS's API"),
        )
        .expect("a method axum routes");
        let answer = on(
            filter,
            move || async move { not_implemented(operation, why) },
        );
        let merged = match by_path.remove(path) {
            Some(existing) => existing.merge(answer),
            None => answer,
        };
        by_path.insert(path, merged);
    }
    for (path, methods) in by_path {
        routes = routes.route(path, methods);
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_is_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for (method, path, operation, _) in UNSERVED {
            assert!(seen.insert((method, path)), "{method} {path} twice");
            assert!(path.starts_with('/'), "{operation}");
        }
        assert_eq!(UNSERVED.len(), 113);
    }

    #[test]
    fn the_message_names_the_operation_and_why() {
        let answer = not_implemented("commit", Why::History);
        assert_eq!(answer.status(), StatusCode::NOT_IMPLEMENTED);
        assert!(answer.message().starts_with("commit is not implemented: "));
        assert!(answer.message().contains("no commit history"));
    }
}
