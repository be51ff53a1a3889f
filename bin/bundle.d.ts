/** the repository root */
export declare const root: string;
/** dist/kproxy.js is at least as new as every source file, and KPROXY_NO_BUNDLE=1 is not set */
export declare function bundleIsFresh(): boolean;
