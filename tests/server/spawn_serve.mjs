// Starts `llmopt serve ARGS` (ARGS must hold --port 0: the server picks a free loopback
// port) and resolves with the child process once it prints its listening address:
// proc.port is that port, proc.logText() its stderr so far, proc.exited ({code, sig})
// is set when it ends. Rejects with the log when it exits before listening or stays
// silent for 20 s. Shared by the server tests (server_test.mjs) and the load bench
// (bench/server_load.mjs). onSpawn(proc) runs right after the spawn (to track it).
import { spawn } from 'node:child_process';

export function spawnServe(llmopt, args, { env = process.env, onSpawn = () => {} } = {}) {
  return new Promise((resolve, reject) => {
    const proc = spawn(llmopt, ['serve', ...args], { stdio: ['ignore', 'ignore', 'pipe'], env });
    onSpawn(proc);
    let log = '';
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log)), 20_000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !proc.port) {
        proc.port = Number(m[1]);
        clearTimeout(timer);
        resolve(proc);
      }
    });
    proc.on('exit', (code, sig) => {
      proc.exited = { code, sig };
      clearTimeout(timer);
      if (!proc.port) reject(new Error(`server exited (${code ?? sig}):\n${log}`));
    });
    proc.logText = () => log;
  });
}
