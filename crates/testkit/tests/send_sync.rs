//! Compile-time proof that the testkit's types are `Send + Sync`, and that the
//! futures of a generic caller over them are `Send`.

use std::time::Duration;

use vantage_api_pool::{Runtime, Transport, timeout_at};
use vantage_api_pool_testkit::{
    DriveError, RecordedEvent, RecordedRequest, RecordingObserver, Reply, ScriptedRequest,
    ScriptedResponse, ScriptedTransport, Sleep, VirtualRuntime,
};

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>(_: &T) {}

#[test]
fn ports_are_send_and_sync() {
    send_sync::<VirtualRuntime>();
    send_sync::<ScriptedTransport>();
    send_sync::<RecordingObserver>();
    send_sync::<Sleep>();
    send_sync::<Reply>();
    send_sync::<ScriptedRequest>();
    send_sync::<ScriptedResponse>();
    send_sync::<RecordedRequest>();
    send_sync::<RecordedEvent>();
    send_sync::<DriveError>();
    // An observer can be shared the way the client holds it (on native: wasm32's
    // observer trait asks for neither `Send` nor `Sync`).
    #[cfg(not(target_arch = "wasm32"))]
    {
        let observer: std::sync::Arc<dyn vantage_api_pool::TransportObserver> =
            std::sync::Arc::new(RecordingObserver::new());
        send(&observer);
    }
}

/// What the attempt loop does, generically: its future must come out `Send`.
async fn one_attempt<T: Transport, R: Runtime>(transport: &T, rt: &R, draft: T::Draft) -> bool {
    transport.admit().await;
    let Ok(request) = transport.prepare(draft) else {
        return false;
    };
    rt.sleep(Duration::from_millis(1)).await;
    timeout_at(
        rt,
        rt.now() + Duration::from_secs(10),
        transport.send(request),
    )
    .await
    .is_ok_and(|r| r.is_ok())
}

#[test]
fn futures_over_them_are_send() {
    let rt = VirtualRuntime::new();
    let transport = ScriptedTransport::new(&rt);
    transport.default_reply(Reply::ok());
    let request = transport.prepare(transport.handle().get("/")).unwrap();
    send(&transport.send(request));
    send(&transport.admit());
    send(&rt.sleep(Duration::from_secs(1)));
    send(&Runtime::sleep_until(&rt, rt.now()));
    let attempt = one_attempt(&transport, &rt, transport.handle().get("/"));
    send(&attempt);
    assert!(rt.block_on(attempt).unwrap());
}
