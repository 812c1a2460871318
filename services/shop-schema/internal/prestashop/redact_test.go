package prestashop

import "testing"

func TestRedactURL(t *testing.T) {
	const key = "ABCDEFGHIJKLMNOPQRSTUVWXYZ123456"
	for raw, want := range map[string]string{
		// What this client writes passes as it is.
		"https://shop.example/api/categories?output_format=JSON&display=[id,name]&sort=[id_ASC]&limit=0,100":                "https://shop.example/api/categories?output_format=JSON&display=[id,name]&sort=[id_ASC]&limit=0,100",
		"https://shop.example/webservice/dispatcher.php?url=product_feature_values&output_format=JSON&filter%5Bcustom%5D=0": "https://shop.example/webservice/dispatcher.php?url=product_feature_values&output_format=JSON&filter%5Bcustom%5D=0",
		"https://shop.example/api/categories?output_format=JSON&ws_key=" + key:                                              "https://shop.example/api/categories?output_format=JSON&REDACTED",
		"https://shop.example/api/categories?token=abc&" + key:                                                              "https://shop.example/api/categories?REDACTED&REDACTED",
		"https://shop.example/" + key + "/api/categories":                                                                   "https://shop.example/REDACTED/api/categories",
		"https://" + key + ":x@shop.example/api/categories#" + key:                                                          "https://shop.example/api/categories",
		"https://shop.example/api/categories?display=" + key:                                                                "https://shop.example/api/categories?display=REDACTED",
		"https://shop.example/api/categories?output_format=JSON&ws%5Fkey=" + key:                                            "https://shop.example/api/categories?output_format=JSON&REDACTED",
		"://not a url": "REDACTED",
	} {
		if got := redactURL(raw, key); got != want {
			t.Errorf("redactURL(%q)\n = %q\nwant %q", raw, got, want)
		}
	}
}
