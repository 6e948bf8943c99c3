//! `GET /` and `GET /dashboard`: the savings page. One self-contained HTML file
//! (inline CSS and JS, no external assets, no build step) that polls `/stats`
//! and draws spent vs saved over time as inline SVG.

use axum::{
    http::{HeaderValue, header},
    response::{Html, IntoResponse, Response},
};

const PAGE: &str = include_str!("../../assets/dashboard.html");

pub async fn dashboard() -> Response {
    let mut response = Html(PAGE).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
