// The seed's paused report writer through ioredis: prints one line per
// step, the same lines paused_writer.py prints through redis-py.
// Usage: node paused_writer.mjs PORT (a server loading the module with
// TEST-CLOCK, so the lease clock is the script's).
import Redis from 'ioredis';

const r = new Redis({ host: '127.0.0.1', port: Number(process.argv[2]), lazyConnect: true, maxRetriesPerRequest: 0 });
await r.connect();

const show = (reply) => (Array.isArray(reply) ? reply.map(show).join(' ') : String(reply));

async function step(label, ...args) {
  let out;
  try {
    out = show(await r.call(...args));
  } catch (e) {
    out = e.message;
  }
  console.log(`${label}: ${out}`);
}

// A fixed lineage so the tokens print the same every run; a real server
// makes a random one at its first acquire.
await step('lineage', 'SET', 'fencecheck:lineage', '7');
await step('A acquires', 'FENCE.ACQUIRE', 'report/july', 'a7', '30000', 'NOW', '1000');
await step('A stages', 'SET', 'reports/july/a7.tmp', "A's render");
// A pauses past its lease; B acquires after it expired.
await step('B acquires', 'FENCE.ACQUIRE', 'report/july', 'b9', '30000', 'NOW', '40000');
await step('B stages', 'SET', 'reports/july/b9.tmp', "B's render");
await step('B publishes', 'FENCE.SET', 'report/july', '7:0.2', 'reports/july/b9.tmp');
// A resumes and publishes with its old token.
await step('A publishes', 'FENCE.SET', 'report/july', '7:0.1', 'reports/july/a7.tmp');
await step('visible', 'GET', 'report/july');
await step('A renews', 'FENCE.RENEW', 'report/july', 'a7', '7:0.1', '30000', 'NOW', '41000');
await step('A releases', 'FENCE.RELEASE', 'report/july', 'a7', '7:0.1');
await step('A discards', 'DEL', 'reports/july/a7.tmp');
await step('B releases', 'FENCE.RELEASE', 'report/july', 'b9', '7:0.2');
r.disconnect();
