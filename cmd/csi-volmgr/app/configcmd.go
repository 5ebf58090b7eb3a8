package app

import (
	"github.com/spf13/cobra"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app/config"
)

// configField names the configuration file's field of each flag of run
// (a dotted path below the document); every flag but --config has one,
// which TestEveryFlagHasAConfigField checks.
var configField = map[string]string{
	"kubeconfig":                             "kubeconfig",
	"node-identity":                          "nodeIdentity",
	"cert-dir":                               "certDir",
	"kube-api-qps":                           "kubeAPIQPS",
	"kube-api-burst":                         "kubeAPIBurst",
	"kube-api-content-type":                  "kubeAPIContentType",
	"node-name":                              "nodeName",
	"root-dir":                               "rootDir",
	"registration-dir":                       "registrationDir",
	"http-endpoint":                          "httpEndpoint",
	"http-endpoint-plaintext":                "httpEndpointPlaintext",
	"tls-cert-file":                          "tlsCertFile",
	"tls-private-key-file":                   "tlsPrivateKeyFile",
	"tls-min-version":                        "tlsMinVersion",
	"tls-cipher-suites":                      "tlsCipherSuites",
	"client-ca-file":                         "clientCAFile",
	"api-audiences":                          "apiAudiences",
	"authentication-token-webhook-cache-ttl": "authenticationTokenWebhookCacheTTL",
	"authorization-webhook-cache-authorized-ttl":   "authorizationWebhookCacheAuthorizedTTL",
	"authorization-webhook-cache-unauthorized-ttl": "authorizationWebhookCacheUnauthorizedTTL",
	"http-max-connections":                         "httpMaxConnections",
	"profiling":                                    "profiling",
	"manifests":                                    "manifests",
	"register-node":                                "registerNode",
	"node-pods":                                    "nodePods",
	"node-cpu":                                     "nodeCPU",
	"node-memory":                                  "nodeMemory",
	"node-labels":                                  "nodeLabels",
	"node-taints":                                  "nodeTaints",
	"expected-drivers":                             "expectedDrivers",
	"remove-terminating-pods":                      "removeTerminatingPods",
	"wait-for-containers-stopped":                  "waitForContainersStopped",
	"cluster-wide-informers":                       "clusterWideInformers",
	"settled-object-resync":                        "settledObjectResync",
	"resync-period":                                "resyncPeriod",
	"csi-timeout":                                  "csiTimeout",
	"front-endpoint":                               "frontEndpoint",
	"front-driver":                                 "frontDriver",
	"mount-check-period":                           "mountCheckPeriod",
	"mount-check-drivers":                          "mountCheckDrivers",
	"stats-period":                                 "statsPeriod",
	"stats-concurrency":                            "statsConcurrency",
	"republish-period":                             "republishPeriod",
	"logging-format":                               "logging.format",
	"log-flush-frequency":                          "logging.flushFrequency",
	"v":                                            "logging.verbosity",
	"vmodule":                                      "logging.vmodule",
	"log-text-split-stream":                        "logging.options.text.splitStream",
	"log-text-info-buffer-size":                    "logging.options.text.infoBufferSize",
	"log-json-split-stream":                        "logging.options.json.splitStream",
	"log-json-info-buffer-size":                    "logging.options.json.infoBufferSize",
}

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "The " + config.Kind + " file of `csi-volmgr run --config`",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "print-defaults",
		Short: "Print the defaults of every setting of run as a " + config.Kind + " document that --config accepts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, err := config.Marshal(config.Defaults())
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(data)
			return err
		},
	})
	return cmd
}
