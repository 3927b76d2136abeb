//! A request sent and its JSON answer read, for a test that only needs
//! the answer: `client.get(url).json_reply().await`.

/// Sends a request and reads its answer as JSON, failing the test on a
/// transport error or a body that is not JSON.
pub trait JsonReply {
    async fn json_reply(self) -> serde_json::Value;
}

impl JsonReply for reqwest::RequestBuilder {
    async fn json_reply(self) -> serde_json::Value {
        let response = self.send().await.unwrap();
        response.json().await.unwrap()
    }
}
