// Loads the README's wasm32 example code (examples/fetch_orders.rs, built for
// wasm32-unknown-unknown as a workspace example) as a Node module made by
// `wasm-bindgen --target nodejs`, as the README's steps make one. Calls its exported
// `order_count` against a server of its own on 127.0.0.1: a 503 then a 200 (the
// client retries), and a 404 (final, thrown as an Error). scripts/wasm-test runs it
// in the Node run.
//
// Usage: node fetch_orders_node.js <path to the generated fetch_orders.js>
"use strict";
const http = require("http");
const assert = require("assert");
const path = require("path");

const { order_count } = require(path.resolve(process.argv[2]));

const seen = { flaky: 0, missing: 0 };
const server = http.createServer((req, res) => {
  if (req.url === "/flaky/orders/count") {
    seen.flaky += 1;
    if (seen.flaky === 1) {
      res.writeHead(503, { "retry-after-ms": "10" });
      res.end("busy");
    } else {
      res.end("42");
    }
  } else {
    seen.missing += 1;
    res.writeHead(404);
    res.end("no such orders");
  }
});

server.listen(0, "127.0.0.1", async () => {
  const base = `http://127.0.0.1:${server.address().port}`;
  try {
    assert.strictEqual(await order_count(`${base}/flaky`), "42");
    assert.strictEqual(seen.flaky, 2, "one 503, then the retry");
    await assert.rejects(order_count(`${base}/gone`), (e) => {
      assert.ok(e instanceof Error);
      assert.strictEqual(e.message, "HTTP 404 after 1 attempt");
      return true;
    });
    assert.strictEqual(seen.missing, 1, "a 404 is final");
    console.log("fetch_orders in Node: ok");
  } catch (e) {
    console.error(e);
    process.exitCode = 1;
  } finally {
    server.close();
  }
});
