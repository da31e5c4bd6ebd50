//! The executor socket (Workhorse's role in GitLab): `GET
//! /api/v4/ai/duo_workflows/ws` upgrades to a WebSocket relayed to the
//! workflow service's `ExecuteWorkflow` stream.

use actix_web::web;

pub fn routes(_cfg: &mut web::ServiceConfig) {}
