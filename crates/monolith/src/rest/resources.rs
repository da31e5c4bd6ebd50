//! Routes of groups, projects, issues, instance settings and seats, and of the
//! sibling modules mounted under them. Every read goes through the policy; what a
//! user may not read answers 404, as if it did not exist.

use actix_web::web;

use super::admin::*;
use super::groups::*;
use super::issues::*;
use super::notes;
use super::projects::*;
use super::{ci, epics, members, merge_requests};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/groups", web::get().to(list_groups))
        .route("/groups", web::post().to(create_group))
        .route("/groups/{id}", web::get().to(show_group))
        .route("/groups/{id}", web::put().to(update_group))
        .route("/projects", web::get().to(list_projects))
        .route("/projects", web::post().to(create_project))
        .route("/projects/{id}", web::get().to(show_project))
        .route("/projects/{id}", web::put().to(update_project))
        .route("/projects/{id}/issues", web::get().to(list_issues))
        .route("/projects/{id}/issues", web::post().to(create_issue))
        .route("/projects/{id}/issues/{iid}", web::get().to(show_issue))
        .route(
            "/projects/{id}/issues/{iid}",
            web::put().to(super::item_updates::update_issue),
        )
        .route(
            "/projects/{id}/issues/{iid}/notes",
            web::get().to(notes::list::<IssueNotes>),
        )
        .route(
            "/projects/{id}/issues/{iid}/notes",
            web::post().to(notes::create::<IssueNotes>),
        )
        .route("/application/settings", web::get().to(show_settings))
        .route("/application/settings", web::put().to(update_settings))
        .route(
            "/add_on_purchases/{add_on}/assignments",
            web::post().to(assign_seat),
        )
        .route("/projects/{id}", web::delete().to(delete_project))
        .configure(super::repository::routes)
        .configure(members::routes)
        .configure(epics::routes)
        .configure(merge_requests::routes)
        .configure(ci::routes);
}
