//! A response body that keeps something alive until the body has been sent
//! to its end or abandoned: a request's places among the requests served at
//! once, its trace span. A handler returns when the response *head* is ready;
//! a stream or a pass-through download goes on long after, and whatever
//! bounds "a request being served" must last as long as its body does.
//!
//! A leaf: it knows bodies, not what is held.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use axum::{
    body::{Body, HttpBody},
    response::Response,
};
use hyper::body::{Frame, SizeHint};

/// `response` with `held` kept alive until its body ends (its last frame is
/// polled) or is dropped (the client left). The body's size hint is kept, so
/// a buffered answer keeps its `Content-Length`.
pub fn hold_until_body_ends<T: Send + 'static>(response: Response, held: T) -> Response {
    response.map(|inner| {
        Body::new(Holding {
            inner,
            held: Some(held),
        })
    })
}

struct Holding<T> {
    inner: Body,
    held: Option<T>,
}

// `held` is never pinned (it is only ever dropped), so `Holding` is `Unpin`
// whatever it holds.
impl<T> Unpin for Holding<T> {}

impl<T: Send + 'static> HttpBody for Holding<T> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            // Ended: let go now rather than when the connection gets round
            // to dropping the body.
            self.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use http_body_util::BodyExt;

    use super::*;

    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn what_is_held_goes_when_the_body_ends_and_not_before() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let (sender, frames) =
            futures::channel::mpsc::channel::<Result<Frame<bytes::Bytes>, axum::Error>>(1);
        let body = Body::new(http_body_util::StreamBody::new(frames));
        let response = hold_until_body_ends(Response::new(body), Counted(dropped.clone()));
        let mut body = response.into_body();
        let mut sender = sender;
        futures::SinkExt::send(
            &mut sender,
            Ok(Frame::data(bytes::Bytes::from_static(b"data: 1\n\n"))),
        )
        .await
        .unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            0,
            "held while the body runs"
        );
        drop(sender);
        assert!(body.frame().await.is_none());
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "let go at the end");
        drop(body);
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "once");
    }

    #[tokio::test]
    async fn an_abandoned_body_lets_go_and_a_buffered_one_keeps_its_length() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let response = hold_until_body_ends(
            Response::new(Body::from("0123456789")),
            Counted(dropped.clone()),
        );
        assert_eq!(response.body().size_hint().exact(), Some(10));
        drop(response);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
    }
}
