//! Storage policy keys 17-21.

use malachi_meta::MetaCommand;
use malachi_wire::messages::Empty;
use malachi_wire::{Reason, Request, Response};

use crate::connection::Connection;
use crate::convert::{policy_field_from_wire, text, topic_policy_to_wire};
use crate::dispatch::{list_policies, meta_command, policy_defaults};

pub(crate) async fn handle(connection: &Connection, request: Request) -> Result<Response, String> {
    match request {
        Request::DefinePolicy(request) => {
            let name = text(&request.name).unwrap_or_default();
            let fields = request.fields.iter().map(policy_field_from_wire).collect();
            meta_command(connection, MetaCommand::DefinePolicy { name, fields }).await?;
            Ok(Response::DefinePolicy(Empty))
        }
        Request::DeletePolicy(request) => {
            let name = text(&request.name).unwrap_or_default();
            meta_command(connection, MetaCommand::DeletePolicy { name, force: request.force })
                .await?;
            Ok(Response::DeletePolicy(Empty))
        }
        Request::ListPolicies(_) => Ok(list_policies(connection)),
        Request::BindTopicPolicy(request) => {
            let topic = text(&request.topic).unwrap_or_default();
            let policy = text(&request.name);
            meta_command(connection, MetaCommand::BindTopicPolicy { topic, policy }).await?;
            Ok(Response::BindTopicPolicy(Empty))
        }
        Request::GetTopicPolicy(request) => {
            let topic = text(&request.topic).unwrap_or_default();
            let defaults = policy_defaults(connection);
            let view =
                connection.broker.meta_group().read(|meta| meta.0.topic_policy(&topic, &defaults));
            view.map(|view| Response::GetTopicPolicy(topic_policy_to_wire(&view)))
                .map_err(|error| error.reason())
        }
        _ => Err(Reason::UnknownApiKey.as_str().to_string()),
    }
}
