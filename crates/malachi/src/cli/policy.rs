//! `malachi policy define|delete|list|bind|unbind|get` (admin).

use std::str::FromStr;

use bytes::Bytes;
use clap::Subcommand;
use malachi_client::TopicPolicyResponse;
use malachi_client::{EffectiveField, Origin, PolicyField, PolicyValue, Resolution};

use super::Session;
use super::output::{lossy, policy_fields, policy_value, table};
use super::settings::ConnectionArgs;

#[derive(clap::Args, Debug)]
pub struct PolicyArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// Define (or replace) a policy. A rule left out inherits the cluster-wide value; `off`
    /// switches it off.
    Define {
        name: String,
        /// Remove records older than this many milliseconds, or `off`.
        #[arg(long, value_name = "MS|off")]
        max_age_ms: Option<Rule<u64>>,
        /// Keep at most this many bytes per range, or `off`.
        #[arg(long, value_name = "BYTES|off")]
        max_bytes: Option<Rule<u64>>,
        /// Spread replicas over distinct values of this broker attribute (`rack`), or `off`.
        #[arg(long, value_name = "ATTRIBUTE|off")]
        spread_by: Option<Rule<String>>,
    },
    /// Delete a policy.
    Delete {
        name: String,
        /// Delete even while topics are bound to it.
        #[arg(long)]
        force: bool,
    },
    /// List the policies and their rules.
    List,
    /// Bind TOPIC to policy NAME.
    Bind { topic: String, name: String },
    /// Detach TOPIC from its policy.
    Unbind { topic: String },
    /// Show TOPIC's policy and every rule's effective value.
    Get { topic: String },
}

/// A rule's value on the command line: a value, or `off`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule<T> {
    Off,
    Set(T),
}

pub async fn run(args: PolicyArgs) -> Result<(), String> {
    let session = Session::connect(&args.connection).await?;
    let client = &session.client;
    match args.command {
        PolicyCommand::Define { name, max_age_ms, max_bytes, spread_by } => {
            let fields = define_fields(max_age_ms, max_bytes, spread_by);
            let defined = client.define_policy(&name, fields).await;
            defined.map_err(|error| session.fail(&format!("define policy {name}"), &error))?;
            println!("defined policy {name}");
        }
        PolicyCommand::Delete { name, force } => {
            let deleted = client.delete_policy(&name, force).await;
            deleted.map_err(|error| session.fail(&format!("delete policy {name}"), &error))?;
            println!("deleted policy {name}");
        }
        PolicyCommand::List => {
            let policies =
                client.list_policies().await.map_err(|e| session.fail("list policies", &e))?;
            let rows: Vec<Vec<String>> = policies
                .iter()
                .map(|policy| vec![lossy(policy.name.as_deref()), policy_fields(&policy.fields)])
                .collect();
            print!("{}", table(&["POLICY", "RULES"], &rows));
        }
        PolicyCommand::Bind { topic, name } => {
            let bound = client.bind_topic_policy(&topic, Some(&name)).await;
            bound.map_err(|error| session.fail_on("bind", &topic, &error))?;
            println!("bound {topic} to policy {name}");
        }
        PolicyCommand::Unbind { topic } => {
            let unbound = client.bind_topic_policy(&topic, None).await;
            unbound.map_err(|error| session.fail_on("unbind", &topic, &error))?;
            println!("unbound {topic}");
        }
        PolicyCommand::Get { topic } => {
            let policy = client.get_topic_policy(&topic).await;
            let policy = policy.map_err(|error| session.fail_on("get policy", &topic, &error))?;
            print!("{}", topic_policy_text(&policy));
        }
    }
    Ok(())
}

/// The wire fields of `policy define`, in a fixed order; flags left out are left out.
fn define_fields(
    max_age_ms: Option<Rule<u64>>,
    max_bytes: Option<Rule<u64>>,
    spread_by: Option<Rule<String>>,
) -> Vec<PolicyField> {
    let field = |name: &'static str, value| PolicyField { name: Some(Bytes::from(name)), value };
    let integer = |rule: Rule<u64>| match rule {
        Rule::Off => PolicyValue::Null,
        Rule::Set(value) => PolicyValue::Integer(value),
    };
    let mut fields = Vec::new();
    if let Some(rule) = max_age_ms {
        fields.push(field("retention.max_age_ms", integer(rule)));
    }
    if let Some(rule) = max_bytes {
        fields.push(field("retention.max_bytes", integer(rule)));
    }
    if let Some(rule) = spread_by {
        let value = match rule {
            Rule::Off => PolicyValue::Null,
            Rule::Set(text) => PolicyValue::String(Bytes::from(text)),
        };
        fields.push(field("spread_by", value));
    }
    fields
}

fn topic_policy_text(policy: &TopicPolicyResponse) -> String {
    let bound = match (&policy.policy, policy.resolution) {
        (None, _) | (_, Resolution::None) => "(none)".to_string(),
        (Some(name), Resolution::Resolved) => lossy(Some(name)),
        (Some(name), Resolution::Unresolved) => format!("{} (not defined)", lossy(Some(name))),
    };
    let mut text = format!("topic   {}\npolicy  {bound}\n", lossy(policy.topic.as_deref()));
    if let Some(fields) = &policy.definition {
        text.push_str(&format!("rules   {}\n", policy_fields(fields)));
    }
    text.push('\n');
    let rows: Vec<Vec<String>> = policy.effective.iter().map(effective_row).collect();
    text.push_str(&table(&["RULE", "VALUE", "FROM"], &rows));
    text
}

fn effective_row(field: &EffectiveField) -> Vec<String> {
    let origin = match field.origin {
        Origin::Global => "global",
        Origin::Policy => "policy",
        Origin::UnresolvedBackstop => "unresolved-policy backstop",
    };
    vec![lossy(field.name.as_deref()), policy_value(&field.value), origin.to_string()]
}

impl<T: FromStr> FromStr for Rule<T> {
    type Err = String;

    fn from_str(text: &str) -> Result<Rule<T>, String> {
        if text == "off" {
            return Ok(Rule::Off);
        }
        text.parse().map(Rule::Set).map_err(|_| format!("expected a value or `off`, got {text:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_values_and_off() {
        assert_eq!("60000".parse::<Rule<u64>>(), Ok(Rule::Set(60_000)));
        assert_eq!("off".parse::<Rule<u64>>(), Ok(Rule::Off));
        assert!("-1".parse::<Rule<u64>>().is_err());
        assert_eq!("rack".parse::<Rule<String>>(), Ok(Rule::Set("rack".to_string())));
    }

    #[test]
    fn define_sends_only_the_rules_given() {
        let fields = define_fields(Some(Rule::Set(60_000)), None, Some(Rule::Off));
        assert_eq!(policy_fields(&fields), "retention.max_age_ms=60000 spread_by=off");
        assert!(define_fields(None, None, None).is_empty());
    }

    #[test]
    fn get_prints_the_binding_and_effective_rules() {
        let policy = TopicPolicyResponse {
            topic: Some(Bytes::from_static(b"orders")),
            policy: Some(Bytes::from_static(b"short")),
            resolution: Resolution::Unresolved,
            definition: None,
            effective: vec![EffectiveField {
                name: Some(Bytes::from_static(b"retention.max_age_ms")),
                value: PolicyValue::Integer(5),
                origin: Origin::UnresolvedBackstop,
            }],
        };
        let expected = "topic   orders\npolicy  short (not defined)\n\n\
                        RULE                  VALUE  FROM\n\
                        retention.max_age_ms  5      unresolved-policy backstop\n";
        assert_eq!(topic_policy_text(&policy), expected);
    }
}
