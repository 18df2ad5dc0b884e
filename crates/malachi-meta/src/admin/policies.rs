//! The cluster's storage policy definitions, kept here because an administrator defines them
//! once for every vnode. A topic's binding to a name lives in its vnode's metadata; what a
//! binding resolves to is `crate::policy`'s business.

use crate::admin::{AdminResponse, AdminState};
use crate::error::{AdminError, PolicyError};
use crate::policy::{PolicyDefinition, PolicyDefinitions, PolicyField, check_policy_name};

impl AdminState {
    /// Defined policies by name.
    pub fn policies(&self) -> &PolicyDefinitions {
        &self.policies
    }

    pub fn policy(&self, name: &str) -> Option<&PolicyDefinition> {
        self.policies.get(name)
    }

    /// Defines or replaces `name` from raw request fields.
    pub(crate) fn define_policy(
        &mut self,
        name: String,
        fields: &[PolicyField],
    ) -> Result<AdminResponse, AdminError> {
        check_policy_name(&name)?;
        let definition = PolicyDefinition::from_fields(fields)?;
        let replaced = self.policies.contains_key(&name);
        let limit = self.limits.max_policies;
        if !replaced && self.policies.len() >= limit as usize {
            return Err(PolicyError::TooManyPolicies { limit }.into());
        }
        self.policies.insert(name, definition);
        Ok(AdminResponse::PolicyDefined { replaced })
    }

    /// Deletes `name`. `bound_topics` are the topics bound to it, as the proposing broker
    /// found them in every vnode: while there are any the delete is refused (`policy_in_use`)
    /// unless `force`, and they turn unresolved. A binding made after they were counted turns
    /// unresolved the same way, which keeps every record of the topic.
    pub(crate) fn delete_policy(
        &mut self,
        name: &str,
        force: bool,
        bound_topics: Vec<String>,
    ) -> Result<AdminResponse, AdminError> {
        check_policy_name(name)?;
        if !bound_topics.is_empty() && !force {
            return Err(PolicyError::PolicyInUse { topics: bound_topics }.into());
        }
        let existed = self.policies.remove(name).is_some();
        let unresolved_topics = if existed { bound_topics } else { Vec::new() };
        Ok(AdminResponse::PolicyDeleted { existed, unresolved_topics })
    }
}
