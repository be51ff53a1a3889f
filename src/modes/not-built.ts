import type { ModeName } from '../config/config.ts';
import type { ModeModule } from './types.ts';

export function notBuilt(name: ModeName): ModeModule {
  const fail = (): never => {
    throw new Error(`KPROXY_MODE_UNAVAILABLE: mode ${name} is not built yet`);
  };
  return { name, render: fail, createProxier: async () => fail(), cleanup: async () => {} };
}
