//! Storage policy keys 17-21, through the broker's policy API (definitions in the
//! administrative group, bindings in each topic's vnode).

use malachi_broker::error::LogError;
use malachi_wire::messages::{Empty, ListPoliciesResponse, NamedPolicy};
use malachi_wire::{Reason, Request, Response};

use crate::connection::Connection;
use crate::convert::{self, policy_field_from_wire, text, text_bytes, topic_policy_to_wire};

pub(crate) async fn handle(connection: &Connection, request: Request) -> Result<Response, String> {
    let broker = &connection.broker;
    match request {
        Request::DefinePolicy(request) => {
            let name = text(&request.name).unwrap_or_default();
            let fields = request.fields.iter().map(policy_field_from_wire).collect();
            broker.admin().define_policy(name, fields).await.map_err(reason)?;
            Ok(Response::DefinePolicy(Empty))
        }
        Request::DeletePolicy(request) => {
            let name = text(&request.name).unwrap_or_default();
            broker.admin().delete_policy(&name, request.force).await.map_err(reason)?;
            Ok(Response::DeletePolicy(Empty))
        }
        Request::ListPolicies(_) => Ok(list_policies(connection)),
        Request::BindTopicPolicy(request) => {
            let topic = text(&request.topic).unwrap_or_default();
            let policy = text(&request.name);
            broker.admin().bind_topic_policy(&topic, policy).await.map_err(reason)?;
            Ok(Response::BindTopicPolicy(Empty))
        }
        Request::GetTopicPolicy(request) => {
            let topic = text(&request.topic).unwrap_or_default();
            let view = broker.admin().topic_policy(&topic).await.map_err(reason)?;
            Ok(Response::GetTopicPolicy(topic_policy_to_wire(&view)))
        }
        _ => Err(Reason::UnknownApiKey.as_str().to_string()),
    }
}

fn list_policies(connection: &Connection) -> Response {
    let policies = connection
        .broker
        .admin()
        .list_policies()
        .into_iter()
        .map(|(name, definition)| NamedPolicy {
            name: text_bytes(&name),
            fields: convert::policy_fields_to_wire(&definition.to_fields()),
        })
        .collect();
    Response::ListPolicies(ListPoliciesResponse { policies })
}

/// A policy call's refusal as its wire reason: metadata that did not answer is
/// `metadata_unavailable`, as for the other metadata keys.
fn reason(error: LogError) -> String {
    error.reason()
}
