//! Storage policies through the broker: definitions in the administrative group (cluster-wide),
//! a topic's binding in its vnode, and what a binding resolves to. The one door the server's
//! policy keys (17-21) go through.

use malachi_meta::{
    AdminCommand, AdminResponse, MetaCommand, PolicyDefaults, PolicyDefinition, PolicyDefinitions,
    PolicyError, PolicyField, TopicPolicyView,
};

use crate::admin::Admin;
use crate::error::LogError;
use crate::node::retention_defaults;

impl Admin {
    /// Defines or replaces policy `name` for the whole cluster.
    pub async fn define_policy(
        &self,
        name: String,
        fields: Vec<PolicyField>,
    ) -> Result<(), LogError> {
        self.admin_command(AdminCommand::DefinePolicy { name, fields }).await.map(drop)
    }

    /// Deletes policy `name`: refused (`policy_in_use`) while topics are bound to it, unless
    /// `force` (they turn unresolved and keep every record). Returns the topics left unresolved.
    pub async fn delete_policy(&self, name: &str, force: bool) -> Result<Vec<String>, LogError> {
        if !force && self.cluster.is_some() {
            // Count bindings made through any broker before the delete.
            for vnode in self.ring.iter() {
                vnode.group.read_barrier().await?;
            }
        }
        let bound_topics = self.topics_bound_to(name);
        let command = AdminCommand::DeletePolicy { name: name.into(), force, bound_topics };
        match self.admin_command(command).await? {
            AdminResponse::PolicyDeleted { unresolved_topics, .. } => Ok(unresolved_topics),
            other => unreachable!("delete_policy answered {other:?}"),
        }
    }

    /// The cluster's policies, sorted by name.
    pub fn list_policies(&self) -> Vec<(String, PolicyDefinition)> {
        self.read_admin(|admin| {
            admin.policies().iter().map(|(name, policy)| (name.clone(), policy.clone())).collect()
        })
    }

    /// Binds `topic` to a defined policy, or detaches it (`None`).
    pub async fn bind_topic_policy(
        &self,
        topic: &str,
        policy: Option<String>,
    ) -> Result<(), LogError> {
        if let Some(name) = &policy {
            malachi_meta::policy::check_policy_name(name).map_err(policy_error)?;
            // Defined a moment ago through another broker, perhaps: catch up before refusing.
            let undefined = || self.read_admin(|admin| admin.policy(name).is_none());
            if undefined() && self.cluster.is_some() {
                self.admin.read_barrier().await?;
            }
            if undefined() {
                return Err(policy_error(PolicyError::NoSuchPolicy));
            }
        }
        self.broker().see_topic(topic).await?;
        let command = MetaCommand::BindTopicPolicy { topic: topic.into(), policy };
        self.propose_meta_named(topic, command).await.map(drop)
    }

    /// `get_topic_policy`: the binding, its resolution and every effective value.
    pub async fn topic_policy(&self, topic: &str) -> Result<TopicPolicyView, LogError> {
        self.broker().see_topic(topic).await?;
        let definitions = self.policy_definitions();
        let spread_by = self.config.cluster.placement.spread_by.clone();
        let defaults = PolicyDefaults { retention: retention_defaults(&self.config), spread_by };
        self.read_meta_named(topic, |meta| meta.topic_policy(topic, &definitions, &defaults))
            .map_err(policy_error)
    }

    /// Moves policy definitions a vnode holds from before they moved to the administrative
    /// group (an older data directory's) there: each name the administrative group does not
    /// define yet is defined as it was, then the vnode forgets them. Run at boot; a failure is
    /// logged and the next boot tries again. Until then a topic bound to a legacy name is
    /// unresolved, which expires nothing.
    pub(crate) async fn migrate_legacy_policies(&self) -> Result<(), LogError> {
        for vnode in self.ring.iter() {
            let legacy = vnode.group.read(|meta| meta.0.legacy_policies().clone());
            if legacy.is_empty() {
                continue;
            }
            for (name, definition) in &legacy {
                if self.read_admin(|admin| admin.policy(name).is_none()) {
                    let fields = definition.to_fields();
                    self.define_policy(name.clone(), fields).await?;
                }
            }
            let names: Vec<String> = legacy.into_keys().collect();
            tracing::info!(
                vnode = vnode.vnode_id(),
                ?names,
                "policy definitions moved to the administrative group"
            );
            vnode
                .group
                .propose(MetaCommand::ForgetLegacyPolicies { names })
                .await?
                .map_err(crate::topics::map_meta_error)?;
        }
        Ok(())
    }

    /// The cluster's policy definitions now (the administrative group's, as applied here).
    pub(crate) fn policy_definitions(&self) -> PolicyDefinitions {
        self.read_admin(|admin| admin.policies().clone())
    }

    /// The topics bound to `policy`, over every vnode, sorted.
    fn topics_bound_to(&self, policy: &str) -> Vec<String> {
        let mut bound = self.read_every_meta(|meta| meta.topics_bound_to(policy));
        bound.sort();
        bound
    }
}

fn policy_error(error: PolicyError) -> LogError {
    LogError::Meta(error.into())
}
