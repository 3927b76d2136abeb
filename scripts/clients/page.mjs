// The chat page at / in a DOM (jsdom), against the real service with the
// demo provider: a streamed answer, a tool call, and a cancel. Run by
// .ci/run with the binary to start.
import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { JSDOM } from 'jsdom';

const freePort = () =>
  new Promise((resolve) => {
    const server = createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });

const binary = process.argv[2];
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const folder = mkdtempSync(join(tmpdir(), 'page-check-'));
const service = spawn(binary, [], {
  env: {
    PATH: process.env.PATH,
    HARNESS_PROVIDERS: 'demo:echo',
    HARNESS_LISTEN: `127.0.0.1:${port}`,
    DATABASE_URL: `sqlite://${folder}/h.db`,
    HARNESS_VAULT_DIR: `${folder}/vault`,
    HARNESS_LOG_FORMAT: 'json',
  },
  stdio: 'ignore',
});

const until = async (what, check, ms = 10000) => {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (check()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`timed out waiting for ${what}`);
};

let passed = 0;
try {
  for (let i = 0; i < 200; i++) {
    try {
      await fetch(`${base}/healthz`);
      break;
    } catch {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  const page = await fetch(`${base}/`);
  if (!page.headers.get('content-type').startsWith('text/html')) throw new Error('not HTML');
  const dom = new JSDOM(await page.text(), {
    url: `${base}/`,
    runScripts: 'dangerously',
    // The page uses the browser's fetch; Node's speaks to the same origin.
    beforeParse(window) {
      window.fetch = (url, options) => fetch(new URL(url, `${base}/`), options);
      window.TextDecoder = TextDecoder;
    },
  });
  const { document } = dom.window;
  const $ = (id) => document.getElementById(id);
  const ask = (text) => {
    $('message').value = text;
    $('send').click();
  };

  ask('hello page');
  await until('the answer', () => $('status').textContent === 'completed');
  const answer = document.querySelector('.answer').textContent;
  if (!answer.startsWith('Echo: hello page')) throw new Error(`answer: ${answer}`);
  passed++;

  ask('search my notes');
  await until('the second answer', () => document.querySelectorAll('.answer').length === 2 && $('status').textContent === 'completed');
  const tools = document.querySelectorAll('.tools')[1].textContent;
  if (!tools.includes('local_search completed')) throw new Error(`tools: ${tools}`);
  passed++;

  ask('a long message to be cut short ' + 'word '.repeat(200));
  await until('streaming', () => document.querySelectorAll('.answer')[2]?.textContent.length > 0);
  $('cancel').click();
  await until('the cancel', () => $('status').textContent === 'cancelled');
  passed++;
  console.log(`page: ${passed} passed, 0 failed`);
  dom.window.close();
} finally {
  service.kill();
}
