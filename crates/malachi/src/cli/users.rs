//! `malachi user create|delete|passwd|list` and `malachi acl grant|revoke|list` (admin).

use clap::{Subcommand, ValueEnum};

use super::Session;
use super::output::table;
use super::settings::{ConnectionArgs, LeadingConnectionArgs};

#[derive(clap::Args, Debug)]
pub struct UserArgs {
    #[command(flatten)]
    connection: LeadingConnectionArgs,
    #[command(subcommand)]
    command: UserCommand,
}

#[derive(Subcommand, Debug)]
enum UserCommand {
    /// Create a user.
    Create {
        name: String,
        /// The new user's password.
        #[arg(long = "password", id = "new_password", value_name = "PASSWORD")]
        new_password: String,
        /// Permissions, comma-separated: admin, produce, consume.
        #[arg(long = "perm", value_enum, value_delimiter = ',', value_name = "PERMS")]
        permissions: Vec<Permission>,
    },
    /// Delete a user (also ends its sessions and removes its ACL grants).
    Delete { name: String },
    /// Change a user's password.
    Passwd {
        name: String,
        /// The new password.
        #[arg(long = "password", id = "new_password", value_name = "PASSWORD")]
        new_password: String,
    },
    /// List users and their permissions.
    List,
}

#[derive(clap::Args, Debug)]
pub struct AclArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    #[command(subcommand)]
    command: AclCommand,
}

#[derive(Subcommand, Debug)]
enum AclCommand {
    /// Allow USER to produce to or consume from topics matching PATTERN.
    Grant {
        // Not `user`: that id is the login flag's (--user), and clap would merge the two.
        #[arg(value_name = "USER")]
        username: String,
        operation: Operation,
        /// A topic name, or a prefix ending in `*`.
        pattern: String,
    },
    /// Remove a grant (removing one that does not exist is fine).
    Revoke {
        #[arg(value_name = "USER")]
        username: String,
        operation: Operation,
        pattern: String,
    },
    /// List USER's grants.
    List {
        #[arg(value_name = "USER")]
        username: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Permission {
    Admin,
    Produce,
    Consume,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Operation {
    Produce,
    Consume,
}

pub async fn run_user(args: UserArgs) -> Result<(), String> {
    let session = Session::connect(&ConnectionArgs::from(args.connection)).await?;
    let client = &session.client;
    match args.command {
        UserCommand::Create { name, new_password, permissions } => {
            let permissions: Vec<&str> = permissions.iter().map(Permission::wire_name).collect();
            let created = client.create_user(&name, &new_password, &permissions).await;
            created.map_err(|error| session.fail(&format!("create user {name}"), &error))?;
            println!("created user {name}");
        }
        UserCommand::Delete { name } => {
            let deleted = client.delete_user(&name).await;
            deleted.map_err(|error| session.fail(&format!("delete user {name}"), &error))?;
            println!("deleted user {name}");
        }
        UserCommand::Passwd { name, new_password } => {
            let changed = client.change_password(&name, &new_password).await;
            changed.map_err(|error| session.fail(&format!("change password of {name}"), &error))?;
            println!("changed the password of {name}");
        }
        UserCommand::List => {
            let users = client.list_users().await.map_err(|e| session.fail("list users", &e))?;
            let rows: Vec<Vec<String>> = users
                .into_iter()
                .map(|user| vec![user.username, user.permissions.join(",")])
                .collect();
            print!("{}", table(&["USER", "PERMISSIONS"], &rows));
        }
    }
    Ok(())
}

pub async fn run_acl(args: AclArgs) -> Result<(), String> {
    let session = Session::connect(&args.connection).await?;
    let client = &session.client;
    match args.command {
        AclCommand::Grant { username: user, operation, pattern } => {
            let granted = client.grant_acl(&user, operation.wire_name(), &pattern).await;
            granted.map_err(|error| session.fail("grant", &error))?;
            println!("granted {} on {pattern} to {user}", operation.wire_name());
        }
        AclCommand::Revoke { username: user, operation, pattern } => {
            let revoked = client.revoke_acl(&user, operation.wire_name(), &pattern).await;
            revoked.map_err(|error| session.fail("revoke", &error))?;
            println!("revoked {} on {pattern} from {user}", operation.wire_name());
        }
        AclCommand::List { username: user } => {
            let acls = client.list_acls(&user).await.map_err(|e| session.fail("list acls", &e))?;
            let rows: Vec<Vec<String>> =
                acls.into_iter().map(|acl| vec![acl.operation, acl.resource]).collect();
            print!("{}", table(&["OPERATION", "PATTERN"], &rows));
        }
    }
    Ok(())
}

impl AclArgs {
    #[cfg(test)]
    pub(crate) fn login_user(&self) -> Option<&str> {
        self.connection.user.as_deref()
    }
}

impl Permission {
    fn wire_name(&self) -> &'static str {
        match self {
            Permission::Admin => "admin",
            Permission::Produce => "produce",
            Permission::Consume => "consume",
        }
    }
}

impl Operation {
    fn wire_name(self) -> &'static str {
        match self {
            Operation::Produce => "produce",
            Operation::Consume => "consume",
        }
    }
}
