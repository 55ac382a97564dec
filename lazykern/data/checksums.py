"""SHA-256 of every UCI dataset file that :func:`lazykern.data.fetch_uci` may download.

Recorded from the files of the uci_datasets repository (github.com/treforevans/uci_datasets); a
download whose digest differs is rejected and never cached. One entry per dataset folder:
``name: (sha256 of data.csv.gz, sha256 of test_mask.csv.gz)``.
"""

SHA256: dict[str, tuple[str, str]] = {
    "airfoil": (
        "1cce82516ac9e564fba52f55d817eb147fc39085f5d7b958ad15b92f4207f23e",
        "dbba6121fb8f900350fe10d724b54faa2b67fcc7bfc3409cf7add717281609e4",
    ),
    "autompg": (
        "31989fbdd7083b901b9f02958581bce9f697e8c27bb3b0d1d0a1cd6d04d6b6c2",
        "4d5e96f4d752bc6effb50ebfc029856c71286abfd64c54e3ae50a8fb62792cb6",
    ),
    "autos": (
        "375efebd3287d10d3f278a424e173648ef7d2b7808f8e4ea68a4b326fac221d9",
        "e6140e5675709299f477c73e05eaa0ebb7af1156c780a4eaef28cd4ffea33b22",
    ),
    "bike": (
        "411f76ae426c0e348a2629dcf6b3b29102c7db465eae780a3454c39db1dfac4f",
        "cf13dc25e80c03019cf2b01666f9cc29b03ea222f5c519536023ea56669bf337",
    ),
    "breastcancer": (
        "2513d5f1037967b10e34972e0bf2ae3a57cf6b2d3a250b2001da10115db4f8e1",
        "f8a703c872a50c302c3199e041ea1db10dad3136a890e6255de6d0f315699fea",
    ),
    "challenger": (
        "2cbf94937ccdf235b4a24006b74dc2132b620fa7516e0c7b7838e37d7a974f7a",
        "de4f2fd395ecd38ad43f0cf7dd5def8795a93fcf12acbef20b0f3c434d120d74",
    ),
    "concrete": (
        "542c5d9a0d301bdb47550280398dcbbe2fb8404631fc945de1ea6df9ade741c6",
        "fae0926c655e4f9fb5669d0dbf2226bd8ff7daaadbd376adb8f32eac6f752e7e",
    ),
    "concreteslump": (
        "6e5cf235fccd8ca8ba2631bd935a8c8f3ee9cc702bfa242b59995a8d2133dd77",
        "7959d17ea0ad8f3a9a4dd5d7eb95c7ba760a50dff435230944c000deb7001661",
    ),
    "elevators": (
        "e39bc18a80ec3611e4fd76d0f86ee377e96ba21b568b9997576d538dafe56b7b",
        "9fe662eacca95ae2c9301cbc4c4134e55d58e903cb0cfb683771ffdd2d248eb5",
    ),
    "energy": (
        "431b6df04243db782bbcd45e408373a654334496ebe5d9c9985ab2e826a39f51",
        "217df2cd4cabf818390e26a65384ea113c95b75bd687787a37ed2f87f28c9bb8",
    ),
    "fertility": (
        "625fa438350ac2da26eafef2c9dd3878755ef707af309c7f441df14412899e29",
        "e1e050098d05e1938f12724c4cedb87228b68943f345e5c9bcb66f75b5a100ee",
    ),
    "forest": (
        "36f3177c8e2e3d8773c0e34116d93ce37f9d58189d861d661bdde2f022999ee7",
        "0c861cacf163cfc50364a4be1376c6e82cff71344b9e12f261dbc0fba0c26854",
    ),
    "gas": (
        "bd82bee47199d3952bee30a59739794b26baa742e1da7f7bd42b9a34552321a1",
        "f171d06831e358dcb6cdf7cd168c2c9ed1768bcd805c8faa427c26099907e64e",
    ),
    "housing": (
        "9f5b8a1cbc051465dcf10f4298aaccd8a596ea68de0db693159be6e7d07ccf12",
        "4c114b259566dd04b92befc3f22709d77fe1d5a9048cebe2452c50d57056c1ac",
    ),
    "keggdirected": (
        "51b7bb56e3f3eae36273cdd5a549c042bdf0ec10948a6f8e6b01a1d6912212cd",
        "b8a7fc902444fdbc5866e8bf314e4778a303d675ef5267c83c5c25b70dacd357",
    ),
    "keggundirected": (
        "117419270e50f581df18bf996ffc8b6bf1bb76c9f3640331ac9d6e64cff63d4e",
        "ea56968ffbf638720943f2758fe0464e1ff532654bc5a67c369a1cda8c6e7f13",
    ),
    "kin40k": (
        "9bee7f2a9f39aa61a015f239378368601fb3978c5bb9a96433e88a55d40883ba",
        "d15fd645d0e81a9a17ce2d0b8dde470bb2efba4d5f417459965abe4b237e2aea",
    ),
    "machine": (
        "aae8f76a052a874dc45b363124515a5192d6ff7dafad04752e87683199babca4",
        "16125e6c73fdd8842ca9a3241e4e0e4fdd71b8099ec80b9e13f8c8e5848791d5",
    ),
    "parkinsons": (
        "d20ffd9c9e5053a03fff0b770e7b0e076bf856a34538198303c897b6cc6addde",
        "090794e6acb34ce9134ce2ac530b60c408adc646e45f9296adf0e3eb134f1a64",
    ),
    "pendulum": (
        "f342636da3047aeb5393a3163974f50e94098c1df9392423e61161eedac2de9e",
        "1da77f6e2b2fe40c6ee4a26b708eb2ef7803d825144259791a37470b573523ac",
    ),
    "pol": (
        "1c16126352954571e78f52d5a9d1b947a38655885d7cadd9407a4c9615fe4e04",
        "c5540259aabe58f5c7a534ed6f5141f8c1157d5de592e45884b7fced6091e981",
    ),
    "protein": (
        "f709d0107c3ee90ab019b9e5d77fc2ae182158958cb70b1903236a51334fd01b",
        "22afe05e8d17c428558d78a77efeecc08d58004b6c95741d1c533c3207c69fe9",
    ),
    "pumadyn32nm": (
        "10d1698944e0f6e586f2781e4b62c17c05174d4c6cdb6fb824a3e5a1b3630ae4",
        "5a70d06c54813712456b3631ef406094c121a20fdc68b2dd400a1045f45b3f43",
    ),
    "servo": (
        "1c18994b739e50bf8dde9d5863680d8aa8ac8f71944adcde1368acac094be6b9",
        "ea63865e63b9146e3fc343b859ecbb9abc6dc233b3ec7999e615cdedc4963b8b",
    ),
    "skillcraft": (
        "41233f5ea6bf596b04aa64f5eaf9bf4489ddeec53524fe2cc46d75bc7d480c0e",
        "d97279b0da7415b80b3a0e8b6acb552bc7f974dc42f142a23a74f645b414736e",
    ),
    "sml": (
        "d7c7e68697fa616bac790f9b50f0c6ea7f5e946a5084792b6ccbe76f8b18baa1",
        "62f96cf8aed97879874d7a359646559b846d764a693740781809609787ca2160",
    ),
    "solar": (
        "71f4aa956db1a443c4f8c2c70e213c82cd8fbfc52b2da955d22283d7b9f68fc8",
        "dd3d70f5aadd75d9a459c9f167d582da6ec9ba4ce1ccf9dd9be31026314eb201",
    ),
    "stock": (
        "d196f315d7c19634f0f549edba569c6c0413e1602837344879dd4b5340470982",
        "d739dcfdcea3bfebd413c644ce27b193454db3cca70e8c33ac4cf88f0e335ea6",
    ),
    "tamielectric": (
        "63507ad1493bd7f36436a900bd2bebaf957d326c6cc20120ab5aefe680f3083a",
        "2c1ba1c09caf1c59cc3893ace43f657e8f86fed85f66c1c45a13e52f38825b2f",
    ),
    "wine": (
        "e2ca3346651ddb43fbc6a1355e70e74b7ce68f93059e04405e9cb749c219eae2",
        "df80c2a700eafb42230991dd7a94c08d47baea55dde125a0a0dcae08964d4559",
    ),
    "yacht": (
        "88ec8ea1a979ab0628a54392822c60b3699ea22541e912e83246f7d49f5adad1",
        "2f6d6b091146887589db66073317b8485e853d27e664b99b8b402ad57ba4a936",
    ),
}
