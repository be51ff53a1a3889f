// The feature gates kube-proxy's --feature-gates / featureGates accept. Upstream's kube-proxy
// registers every gate of the Kubernetes gate (pkg/features: kube_features.go and
// versioned_kube_features.go), the client-go gates it wires into it, and component-base's
// logging gates; featuregate.SetFromMap refuses any other name with
// `unrecognized feature gate: NAME`. kproxy refuses the same (KPROXY_CONFIG_INVALID) and
// accepts a known gate with one warning: kproxy has no gates, every feature it has is on;
// KubeProxyNFTablesLocalhostNodePorts=false alone changes something (src/core/nodeview.ts
// localhostNodePortProxyWanted).
//
// Source of the names: kubernetes/kubernetes pkg/features/kube_features.go (stored commit
// 0021731de5897e81f1d576a134db15c7c301eeff), plus the gates kube-proxy reads at v1.34 and
// the client-go / component-base gates registered into the same gate. Gates upstream removed
// since are still accepted here (kproxy errs on the side of starting).

/** featuregate's pseudo-gates: every alpha / every beta gate at once */
const PSEUDO = ['AllAlpha', 'AllBeta'];

/** gates that change what kube-proxy itself does (pkg/proxy reads them) */
export const KUBE_PROXY_GATES = [
  'KubeProxyDrainingTerminatingNodes', 'LoadBalancerIPMode', 'MultiCIDRServiceAllocator', 'NFTablesProxyMode',
  'PreferSameTrafficDistribution', 'ServiceTrafficDistribution', 'TopologyAwareHints', 'WinDSR', 'WinOverlay',
  'WindowsHostNetwork', 'IPvsNoMasquerade',
  // alpha in v1.37 (KEP-6032): the nftables mode's userspace proxy for localhost NodePorts
  'KubeProxyNFTablesLocalhostNodePorts',
];

/** component-base (logging, metrics) and client-go gates registered into kube's gate */
const COMPONENT_GATES = [
  'ContextualLogging', 'LoggingAlphaOptions', 'LoggingBetaOptions', 'ComponentSLIs',
  'WatchListClient', 'InformerResourceVersion', 'InOrderInformers', 'ClientsAllowCBOR', 'ClientsPreferCBOR',
];

/** pkg/features/kube_features.go (stored commit above) */
const KUBE_GATES = [
  'AllowDNSOnlyNodeCSR', 'AllowOverwriteTerminationGracePeriodSeconds', 'AnyVolumeDataSource', 'AppArmor', 'AppArmorFields',
  'AuthorizeNodeWithSelectors', 'ClusterTrustBundle', 'ClusterTrustBundleProjection', 'CustomCPUCFSQuotaPeriod', 'CPUManager',
  'CPUManagerPolicyAlphaOptions', 'CPUManagerPolicyBetaOptions', 'CPUManagerPolicyOptions', 'CoordinatedLeaderElection',
  'CSIMigrationPortworx', 'CSIVolumeHealth', 'ContainerCheckpoint', 'CronJobsScheduledAnnotation', 'CrossNamespaceVolumeDataSource',
  'DevicePluginCDIDevices', 'DisableAllocatorDualWrite', 'DisableCloudProviders', 'DisableKubeletCloudCredentialProviders',
  'AllowInsecureKubeletCertificateSigningRequests', 'KubeletRegistrationGetOnExistsOnly', 'DisableNodeKubeProxyVersion',
  'DynamicResourceAllocation', 'EventedPLEG', 'ExecProbeTimeout', 'GracefulNodeShutdown', 'GracefulNodeShutdownBasedOnPodPriority',
  'HPAContainerMetrics', 'HPAScaleToZero', 'HonorPVReclaimPolicy', 'InTreePluginPortworxUnregister', 'JobBackoffLimitPerIndex',
  'JobManagedBy', 'JobPodFailurePolicy', 'JobPodReplacementPolicy', 'JobSuccessPolicy', 'KubeletCgroupDriverFromCRI',
  'KubeletFineGrainedAuthz', 'KubeletInUserNamespace', 'KubeletPodResourcesDynamicResources', 'KubeletPodResourcesGet',
  'KubeletSeparateDiskGC', 'KubeletTracing', 'LocalStorageCapacityIsolationFSQuotaMonitoring',
  'LogarithmicScaleDown', 'MatchLabelKeysInPodAffinity', 'MatchLabelKeysInPodTopologySpread', 'MaxUnavailableStatefulSet',
  'MemoryManager', 'MemoryQoS', 'NodeLogQuery', 'NodeSwap', 'PDBUnhealthyPodEvictionPolicy',
  'PersistentVolumeLastPhaseTransitionTime', 'PodAndContainerStatsFromCRI', 'PodDeletionCost', 'PodDisruptionConditions',
  'PodIndexLabel', 'PodReadyToStartContainersCondition', 'PodHostIPs', 'PodLifecycleSleepAction', 'PodSchedulingReadiness',
  'PortForwardWebsockets', 'ProcMountType', 'QOSReserved', 'RecoverVolumeExpansionFailure', 'RecursiveReadOnlyMounts',
  'RelaxedDNSSearchValidation', 'RelaxedEnvironmentVariableValidation', 'ReloadKubeletServerCertificateFile', 'ResourceHealthStatus',
  'RotateKubeletServerCertificate', 'RuntimeClassInImageCriApi', 'ElasticIndexedJob', 'SchedulerQueueingHints',
  'SeparateTaintEvictionController', 'ServiceAccountTokenJTI', 'ServiceAccountTokenNodeBinding',
  'ServiceAccountTokenNodeBindingValidation', 'ServiceAccountTokenPodNodeInfo', 'SidecarContainers', 'SizeMemoryBackedVolumes',
  'StatefulSetAutoDeletePVC', 'StatefulSetStartOrdinal', 'StorageNamespaceIndex', 'StorageVersionMigrator',
  'TopologyManagerPolicyAlphaOptions', 'TopologyManagerPolicyBetaOptions', 'TopologyManagerPolicyOptions',
  'TranslateStreamCloseWebsocketRequests', 'UnknownVersionInteroperabilityProxy', 'UserNamespacesSupport', 'VolumeAttributesClass',
  'VolumeCapacityPriority', 'NodeInclusionPolicyInPodTopologySpread', 'SELinuxMountReadWriteOncePod', 'InPlacePodVerticalScaling',
  'ImageMaximumGCAge', 'UserNamespacesPodSecurityStandards', 'SELinuxMount', 'SupplementalGroupsPolicy', 'ImageVolume',
  'SELinuxChangePolicy',
];

/** every gate name kube-proxy accepts */
export const KNOWN_FEATURE_GATES: ReadonlySet<string> = new Set([...PSEUDO, ...KUBE_PROXY_GATES, ...COMPONENT_GATES, ...KUBE_GATES]);
