// Reads the --config file: the host side of config.ts, which stays pure so that planners
// can import the configuration's types and defaults.
import { readFileSync } from 'node:fs';
import { ConfigError, parseConfigText, type RawConfig } from './config.ts';

export function loadConfigFile(path: string): RawConfig {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new ConfigError('--config', `cannot read ${path}: ${(e as Error).message}`);
  }
  return parseConfigText(text, path);
}
